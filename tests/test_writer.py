"""Shards and the job folder: whole shards only, recorded settings, refusal, resume scan."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkgen.errors import UserError
from bulkgen.io.job import JobDir
from bulkgen.io.writer import ShardWriter
from bulkgen.row import Row
from bulkgen.run_config import OUTPUT_COLUMNS, RunConfig


def done_rows(n, start=0):
    rows = []
    for i in range(start, start + n):
        row = Row(f"r{i}", f"prompt {i}", extra={"topic": f"t{i}"}, prompt_text=f"prompt {i}")
        row.prompt_ids, row.token_ids = [1, 2, 3], [4] * (i % 3)
        row.finish_reason, row.text = "stop", f"answer {i}"
        rows.append(row)
    return rows


def test_full_shards_are_written_as_they_fill_and_the_rest_on_flush(tmp_path):
    writer = ShardWriter(tmp_path, "parquet", shard_size=4, keep_columns=("topic",))
    writer.add(done_rows(6))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00000.parquet"]
    writer.add(done_rows(3, start=6))
    writer.flush()
    assert writer.shards == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    tables = [pq.read_table(tmp_path / name) for name in writer.shards]
    assert [t.num_rows for t in tables] == [4, 4, 1]
    assert tables[0].column_names == [*OUTPUT_COLUMNS, "topic"]
    first = tables[0].to_pylist()[1]
    assert first == {
        "id": "r1",
        "prompt": "prompt 1",
        "text": "answer 1",
        "finish_reason": "stop",
        "error": None,
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "topic": "t1",
    }
    # No temporary file is left behind.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_jsonl_shards_hold_one_object_per_row(tmp_path):
    writer = ShardWriter(tmp_path, "jsonl", shard_size=10, first_index=3)
    error = Row("bad", None)
    error.fail("prompt is null")
    writer.add(done_rows(2) + [error])
    writer.flush()
    lines = (tmp_path / "part-00003.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["id"] for r in records] == ["r0", "r1", "bad"]
    assert records[2] == {
        "id": "bad",
        "prompt": None,
        "text": None,
        "finish_reason": "error",
        "error": "prompt is null",
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }


def test_a_row_the_shard_cannot_hold_is_its_own_error_record(tmp_path):
    writer = ShardWriter(
        tmp_path, "parquet", shard_size=10, keep_columns=("meta",), keep_types={"meta": pa.int64()}
    )
    rows = done_rows(2)
    rows[0].extra, rows[1].extra = {"meta": 1}, {"meta": {"a": [1]}}
    writer.add(rows)
    writer.flush()
    table = pq.read_table(tmp_path / "part-00000.parquet").to_pylist()
    assert [(r["meta"], r["finish_reason"]) for r in table] == [(1, rows[0].finish_reason),
                                                                 (None, "error")]  # fmt: skip
    assert table[1]["error"].startswith("writing this row failed: ArrowInvalid: Could not convert")
    assert writer.faults == 1


def config(tmp_path, **kw):
    return RunConfig(inputs=("in.jsonl",), out=str(tmp_path / "out"), model="m", **kw)


def test_scan_finds_the_ids_and_totals_of_complete_shards_and_drops_temporaries(tmp_path):
    job = JobDir(tmp_path / "out")
    job.lock()
    job.prepare({"settings": config(tmp_path).job_settings()}, overwrite=False)
    writer = ShardWriter(job.path, "parquet", shard_size=2)
    writer.add(done_rows(5))
    (job.path / ".part-00002.parquet.tmp").write_bytes(b"half a shard")
    done = job.prepare({"settings": config(tmp_path).job_settings()}, overwrite=False)
    assert done.ids == {"r0", "r1", "r2", "r3"}
    assert (done.rows, done.prompt_tokens, done.completion_tokens) == (4, 12, 0 + 1 + 2 + 0)
    assert done.next_index == 2
    assert not (job.path / ".part-00002.parquet.tmp").exists()


def test_a_rerun_with_other_settings_is_refused_naming_what_differs(tmp_path):
    job = JobDir(tmp_path / "out")
    job.check(config(tmp_path).job_settings(), overwrite=False)
    job.lock()
    job.prepare({"settings": config(tmp_path).job_settings()}, overwrite=False)
    ShardWriter(job.path, "parquet", 1).add(done_rows(1))  # a job with rows written
    job.unlock()
    job.check(config(tmp_path, shard_size=7).job_settings(), overwrite=False)  # harmless change
    changed = config(tmp_path, prompt_column="question", format="jsonl")
    with pytest.raises(UserError) as e:
        job.check(changed.job_settings(), overwrite=False)
    assert "format was 'parquet', now 'jsonl'" in str(e.value)
    assert "prompt_column was 'prompt', now 'question'" in str(e.value)
    assert "--overwrite" in str(e.value)
    job.check(changed.job_settings(), overwrite=True)


@pytest.mark.parametrize(
    "setting",
    [
        {"load_format": "dummy"},
        {"dtype": "float32"},
        {"quantization": "fp8"},
        {"kv_cache_dtype": "int8"},
        {"max_model_len": 512},
        {"fp8_fast_accum": False},
    ],
)
def test_a_rerun_with_other_weights_dtype_or_context_is_refused_both_ways(tmp_path, setting):
    """A dummy-weights trial, or a bf16 run, must not be resumed as the real or float32 job."""
    (key,) = setting
    job = JobDir(tmp_path / "out")
    job.lock()
    job.prepare({"settings": config(tmp_path, **setting).job_settings()}, overwrite=False)
    ShardWriter(job.path, "parquet", 1).add(done_rows(1))
    job.unlock()
    job.check(config(tmp_path, **setting).job_settings(), overwrite=False)
    with pytest.raises(UserError) as e:
        job.check(config(tmp_path).job_settings(), overwrite=False)
    assert f"{key} was {setting[key]!r}, now the default" in str(e.value)
    other = JobDir(tmp_path / "other")
    other.lock()
    other.prepare({"settings": config(tmp_path).job_settings()}, overwrite=False)
    ShardWriter(other.path, "parquet", 1).add(done_rows(1))
    other.unlock()
    with pytest.raises(UserError) as e:
        other.check(config(tmp_path, **setting).job_settings(), overwrite=False)
    assert f"{key} was the default, now {setting[key]!r}" in str(e.value)


def test_a_job_that_wrote_nothing_takes_a_rerun_with_other_settings(tmp_path):
    """A run that died before its first shard (a wrong --model, Ctrl-C during the load) left
    job.json: a rerun with corrected settings was refused as a changed job (only a Ray run
    forgot the record). With no row written there is nothing to mix with: the rerun records
    its own settings and runs; once a shard exists, other settings are refused again."""
    job = JobDir(tmp_path / "out")
    job.lock()
    job.prepare({"settings": config(tmp_path).job_settings()}, overwrite=False)
    job.unlock()  # and the process died
    fixed = config(tmp_path, prompt_column="question").job_settings()
    job.check(fixed, overwrite=False)
    assert job.check_inputs({"/a.jsonl": {"source": "a"}}, False, False) == []
    job.lock()
    job.prepare({"settings": fixed}, overwrite=False)
    recorded = json.loads((job.path / "job.json").read_text())["settings"]
    assert recorded["prompt_column"] == "question"
    ShardWriter(job.path, "parquet", 1).add(done_rows(1))
    job.unlock()
    with pytest.raises(UserError, match="other settings"):
        job.check(config(tmp_path).job_settings(), overwrite=False)


def test_overwrite_clears_the_old_job(tmp_path):
    job = JobDir(tmp_path / "out")
    job.lock()
    job.prepare({"settings": {"model": "a"}}, overwrite=False)
    ShardWriter(job.path, "parquet", 1).add(done_rows(2))
    (job.path / "notes.txt").write_text("mine")
    done = job.prepare({"settings": {"model": "b"}}, overwrite=True)
    assert done.rows == 0
    assert sorted(p.name for p in job.path.iterdir()) == [".lock", "job.json", "notes.txt"]
    assert json.loads((job.path / "job.json").read_text())["settings"] == {"model": "b"}


def test_a_folder_of_foreign_shards_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part-00000.parquet").write_bytes(b"")
    with pytest.raises(UserError, match="not a bulkgen job folder"):
        JobDir(tmp_path / "out").check({}, overwrite=False)


def test_two_runs_cannot_write_one_folder_at_once(tmp_path):
    JobDir(tmp_path / "out").lock()
    with pytest.raises(UserError, match="another bulkgen run is writing"):
        JobDir(tmp_path / "out").lock()


@pytest.mark.parametrize("response", ["old answer", None])
def test_jsonl_rows_keeping_custom_id_and_response_columns_resume_as_rows(tmp_path, response):
    """A --format jsonl row that keeps input columns named like a Batch output line's is still
    a row: a rerun reads it by its id, and shards sharing a kept custom_id stay."""
    job = JobDir(tmp_path / "out")
    job.lock()
    job.prepare({"settings": {}}, overwrite=False)
    writer = ShardWriter(job.path, "jsonl", 2, keep_columns=("custom_id", "response"))
    rows = done_rows(4)
    for row in rows:
        row.extra = {"custom_id": "same", "response": response}
    writer.add(rows)
    done = job.prepare({"settings": {}}, overwrite=False)
    assert done.ids == {"r0", "r1", "r2", "r3"}
    assert (done.rows, done.errors) == (4, 0)
    assert sorted(p.name for p in job.path.glob("part-*")) == [
        "part-00000.jsonl",
        "part-00001.jsonl",
    ]


def test_jsonl_lines_are_strict_json_with_non_finite_numbers_as_null(tmp_path):
    from bulkgen.io.json_line import json_line

    rows = done_rows(2)
    rows[0].extra = {"score": float("nan"), "ok": 1.5}
    rows[1].extra = {"score": float("-inf"), "ok": [float("inf"), 2.0]}
    writer = ShardWriter(tmp_path, "jsonl", shard_size=2, keep_columns=("score", "ok"))
    writer.add(rows)
    lines = (tmp_path / "part-00000.jsonl").read_text().splitlines()

    def strict(text):  # json.loads takes NaN and Infinity unless told not to
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {text}"))

    assert [(r["score"], r["ok"]) for r in map(strict, lines)] == [(None, 1.5), (None, [None, 2.0])]
    assert json_line({"a": "é", "b": 1.0}) == '{"a": "é", "b": 1.0}'  # the fast path as before


def test_a_data_parallel_attempt_claim_keeps_the_recorded_settings(tmp_path):
    """A folder with no shard but a worker's attempt claim (io/fence.py): a worker of the
    killed run (a Ray actor) may still land a shard of its settings, so other settings are
    refused as before."""
    job = JobDir(tmp_path / "out")
    job.lock()
    job.prepare({"settings": config(tmp_path).job_settings()}, overwrite=False)
    (job.path / ".attempt-w00-00").touch()
    job.unlock()
    with pytest.raises(UserError, match="other settings"):
        job.check(config(tmp_path, prompt_column="question").job_settings(), overwrite=False)
