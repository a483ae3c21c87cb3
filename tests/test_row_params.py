"""Per-row sampling parameters: optional input columns override the job's for their row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from test_pipeline import RecordingEngine, factory, make_config, output, write_jsonl

from bulkgen.config import SamplingParams
from bulkgen.pipeline import run


def test_parameter_columns_override_the_job_defaults(tmp_path, tiny_model_dir):
    records = [
        {"id": "a", "prompt": "Hello"},
        {"id": "b", "prompt": "Hello", "max_tokens": 3, "temperature": 0.7, "top_p": 0.9},
        {"id": "c", "prompt": "Hello", "top_k": 5, "min_p": 0.1, "seed": 42, "stop": "x"},
        {"id": "d", "prompt": "Hello", "stop": ["x", "y"], "max_tokens": None},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    sampling = SamplingParams(max_tokens=9, temperature=0.0)
    run(make_config(tmp_path, tiny_model_dir, [path], sampling=sampling), factory())
    added = RecordingEngine.instances[0].added.values()  # in input order
    given = {row_id: p for row_id, (_, p) in zip("abcd", added, strict=True)}
    assert given["a"] == sampling
    assert (given["b"].max_tokens, given["b"].temperature, given["b"].top_p) == (3, 0.7, 0.9)
    c = given["c"]
    assert (c.top_k, c.min_p, c.seed, c.stop) == (5, 0.1, 42, ("x",))
    assert given["d"].stop == ("x", "y") and given["d"].max_tokens == 9


def test_a_bad_parameter_value_is_that_rows_error(tmp_path, tiny_model_dir):
    records = [
        {"id": "ok", "prompt": "Hello"},
        {"id": "neg", "prompt": "Hello", "max_tokens": 0},
        {"id": "str", "prompt": "Hello", "temperature": "hot"},
        {"id": "frac", "prompt": "Hello", "top_k": 2.5},
        {"id": "p", "prompt": "Hello", "top_p": 1.5},
        {"id": "stop", "prompt": "Hello", "stop": [1, 2]},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["ok"]["error"] is None
    for row_id, words in [("neg", "max_tokens"), ("str", "temperature"), ("frac", "top_k"),
                          ("p", "top_p"), ("stop", "stop")]:  # fmt: skip
        assert rows[row_id]["finish_reason"] == "error"
        assert "bad sampling parameter" in rows[row_id]["error"] and words in rows[row_id]["error"]


def test_parquet_parameter_columns_reach_the_real_engine(tmp_path, tiny_model_dir):
    table = pa.table({"prompt": ["Hello", "The quick", "Hi"], "max_tokens": [2, None, 4]})
    pq.write_table(table, tmp_path / "in.parquet")
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    config = make_config(tmp_path, tiny_model_dir, [tmp_path / "in.parquet"], sampling=sampling,
                         device="cpu")  # fmt: skip
    run(config)
    rows = sorted(output(tmp_path / "out"), key=lambda r: r["id"])
    assert [r["completion_tokens"] for r in rows] == [2, 6, 4]
