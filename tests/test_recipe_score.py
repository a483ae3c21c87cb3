"""A recipe's score section is checked before any work: a reference column the run would not
keep, or a references file that is not there, stops the run in one line (it failed only after
the whole generation)."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from bulkgen.cli import main


@pytest.mark.parametrize(
    "fields, words",
    [
        ({}, "score reads the reference column 'answer' from the results, and the run does not"),
        ({"score": {"references": "missing.jsonl"}}, "missing.jsonl is not a file"),
        (
            {"keep_columns": "answer", "score": {"baseline": "yesterday"}},
            "score.baseline " + "{tmp}/yesterday is not a folder",
        ),
        (  # Batch lines keep no column
            {"format": "openai"},
            "--format openai lines keep no column: name a score.references file",
        ),
    ],
)
def test_a_score_that_could_not_run_stops_the_run_before_any_work(tmp_path, fields, words):
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "q1", "prompt": "2+2?"}) + "\n")
    recipe = {"inputs": "q.jsonl", "out": "out", "model": "unused", "score": {}} | fields
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(main, ["run", "--recipe", str(path)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    words = words.format(tmp=tmp_path)
    assert len(lines) == 1 and lines[0].startswith(f"error: recipe {path}: ") and words in lines[0]
    assert not (tmp_path / "out").exists()
