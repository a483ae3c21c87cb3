"""A job with nothing to generate says so and exits 0 without loading the model (idle.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bulkgen import pipeline
from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pipeline, "checked_parts", refuse)


def test_an_empty_input_says_so_and_needs_no_model(tmp_path, no_model_load):
    (tmp_path / "empty.jsonl").write_text("")
    result = bulkgen("run", tmp_path / "empty.jsonl", "-m", tmp_path / "no-model", "-o",
                     tmp_path / "out")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        result.stderr.strip() == f"nothing to generate: the input has no rows ({tmp_path / 'out'})"
    )
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["rows"] == 0


def test_a_finished_job_rerun_says_so_and_keeps_its_stats(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1}))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"Q{i}?"}) + "\n" for i in range(7)))
    args = ("run", inp, "-m", tiny_model_dir, "-o", tmp_path / "out", "--n", "2")
    assert bulkgen(*args).exit_code == 0
    stats = (tmp_path / "out" / "stats.json").read_text()

    monkeypatch.setattr(pipeline, "checked_parts", lambda *a, **k: 1 / 0)
    result = bulkgen(*args)
    assert result.exit_code == 0, result.output
    assert "nothing to generate: all 7 input rows are in complete shards already" in result.stderr
    assert (tmp_path / "out" / "stats.json").read_text() == stats


def test_a_rerun_with_nothing_left_mends_a_stale_stats_file(tmp_path, tiny_model_dir, monkeypatch):
    """A run killed after its last shard and before its stats.json left the earlier run's
    stats.json: the rerun found nothing to generate and kept it as it was (10 rows where the
    shards hold 20), and so did every rerun after it."""
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1}))
    for name in "ab":
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"id": f"{name}{i}", "prompt": f"Q{i}?"}) + "\n" for i in range(5))
        )
    out = tmp_path / "out"
    first = ("run", tmp_path / "a.jsonl", "-m", tiny_model_dir, "-o", out)
    assert bulkgen(*first).exit_code == 0
    stale = (out / "stats.json").read_text()
    both = ("run", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "-m", tiny_model_dir, "-o", out)
    assert bulkgen(*both).exit_code == 0
    (out / "stats.json").write_text(stale)  # as the kill before its write left it
    result = bulkgen(*both)
    assert result.exit_code == 0 and "nothing to generate" in result.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["rows"], stats["shards"]) == (10, 2)
    assert json.loads(stale)["model"] == stats["model"]  # the rest of it kept


def test_a_job_with_rows_left_loads_the_model(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1}))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"Q{i}?"}) + "\n" for i in range(3)))
    args = ("run", inp, "-m", tiny_model_dir, "-o", tmp_path / "out", "--shard-size", "1")
    assert bulkgen(*args).exit_code == 0
    (tmp_path / "out" / "part-00001.parquet").unlink()  # a lost shard: one row left to do
    result = bulkgen(*args)
    assert result.exit_code == 0 and "1 rows (0 errors) written" in result.stderr


def test_the_first_fetch_of_the_demo_model_says_what_it_does_and_how_big(tmp_path, monkeypatch):
    from bulkgen.model import hub

    monkeypatch.setenv("BULKGEN_CACHE", str(tmp_path / "cache"))
    failed = type("Done", (), {"returncode": 1, "stderr": "no network"})
    monkeypatch.setattr(hub.subprocess, "run", lambda *a, **k: failed)
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    result = bulkgen("run", tmp_path / "in.jsonl", "-o", tmp_path / "out")
    assert result.exit_code == 1
    first = result.stderr.splitlines()[0]
    assert first.startswith("bulkgen: fetching the demo model SmolLM2-135M-Instruct once, from")
    assert "about 93 MB" in first
