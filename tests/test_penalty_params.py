"""Penalty parameters reach the job: flags, recipe fields, per-row columns, OpenAI Batch fields.

(How the engine applies them is engine/penalties.py, tested in test_penalties.py.)
"""

from __future__ import annotations

import json

from test_cli import bulkgen
from test_pipeline import RecordingEngine, factory, make_config, output, write_jsonl
from test_recipes import write_recipe

from bulkgen.cli import run as run_command
from bulkgen.config import SamplingParams
from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.pipeline import run
from bulkgen.recipes import load_recipe

PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")


def penalties(params: SamplingParams) -> tuple[float, float, float]:
    return tuple(getattr(params, name) for name in PENALTIES)


def test_penalty_flags_are_recorded_in_job_and_stats(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hello"}])
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q",
                     "--repetition-penalty", "1.2", "--presence-penalty", "0.5",
                     "--frequency-penalty", "-0.25")  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("job.json", "stats.json"):
        recorded = json.loads((tmp_path / "out" / name).read_text())
        sampling = recorded["settings"]["sampling"] if name == "job.json" else recorded["sampling"]
        assert [sampling[p] for p in PENALTIES] == [1.2, 0.5, -0.25], name


def test_a_penalty_flag_out_of_range_is_a_usage_error(tmp_path):
    result = bulkgen("run", tmp_path / "in.jsonl", "-o", tmp_path / "out",
                     "--presence-penalty", "3")  # fmt: skip
    assert result.exit_code == 2 and "presence_penalty must be a number in [-2, 2]" in result.output


def test_penalties_are_recipe_fields(tmp_path):
    path = write_recipe(tmp_path, {"repetition_penalty": 1.1, "frequency_penalty": 0.3})
    options = load_recipe(path, run_command).options
    assert (options["repetition_penalty"], options["frequency_penalty"]) == (1.1, 0.3)


def test_penalty_columns_override_the_job_per_row(tmp_path, tiny_model_dir):
    records = [
        {"id": "job", "prompt": "Hello"},
        {"id": "own", "prompt": "Hello", "repetition_penalty": 1.3, "presence_penalty": -1,
         "frequency_penalty": 2},
        {"id": "rep", "prompt": "Hello", "repetition_penalty": 0},
        {"id": "freq", "prompt": "Hello", "frequency_penalty": 2.5},
        {"id": "pres", "prompt": "Hello", "presence_penalty": "high"},
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "in.jsonl", records)
    sampling = SamplingParams(max_tokens=4, temperature=0.0, repetition_penalty=1.05)
    run(make_config(tmp_path, tiny_model_dir, [path], sampling=sampling), factory())
    added = [p for _, p in RecordingEngine.instances[0].added.values()]  # good rows, in order
    assert [penalties(p) for p in added] == [(1.05, 0.0, 0.0), (1.3, -1.0, 2.0)]
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    for row_id, name in [("rep", "repetition_penalty"), ("freq", "frequency_penalty"),
                         ("pres", "presence_penalty")]:  # fmt: skip
        assert rows[row_id]["finish_reason"] == "error"
        assert "bad sampling parameter" in rows[row_id]["error"] and name in rows[row_id]["error"]


def test_openai_batch_bodies_set_the_penalties(tmp_path, tiny_model_dir):
    body = {"messages": [{"role": "user", "content": "Hi"}], "presence_penalty": 0.6,
            "frequency_penalty": 0.4, "repetition_penalty": 1.15}  # fmt: skip
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    path = write_jsonl(tmp_path / "batch.jsonl", [line])
    run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    [(_, params)] = RecordingEngine.instances[0].added.values()
    assert penalties(params) == (1.15, 0.6, 0.4)
