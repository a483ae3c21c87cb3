"""Every bad row is its own error record, naming the field; nothing a row holds ends the job."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkgen.config import SamplingParams
from bulkgen.engine.fake import FakeEngine
from bulkgen.errors import UserError
from bulkgen.guard import RowGuard
from bulkgen.io.inputs import find_sources
from bulkgen.io.reader import Reader
from bulkgen.pipeline import run
from bulkgen.row import Row
from bulkgen.run_config import RunConfig

DEEP = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit: json.loads cannot parse it
# Each raw JSONL line, and the start of the error its row must carry.
BAD_LINES = {
    '{"id": "deep", "prompt": ' + DEEP + "}": "row 0, line 1: JSON nested too deeply to parse",
    '{"id": "nest", "prompt": "a", "meta": ' + "[" * 40 + "]" * 40 + "}": "column 'meta' nests",
    '{"id": "lone", "prompt": "a \\ud800 b"}': "prompt holds '\\ud800' at character 2",
    '{"id": "msg", "messages": [{"role": "user", "content": "\\udfff"}]}': "messages holds",
    '{"id": "sur\\ud800", "prompt": "a"}': "id 'sur\\ud800' holds '\\ud800'",
    '{"id": {"a": 1}, "prompt": "a"}': "id is dict {'a': 1}, not a string or an integer",
    '{"id": "", "prompt": "a"}': "id is empty",
    '{"id": "k20", "prompt": "a", "top_k": 1e20}': "bad sampling parameter: top_k must be",
    '{"id": "k63", "prompt": "a", "top_k": 9223372036854775808}': "bad sampling parameter: top_k",
    '{"id": "nan", "prompt": "a", "temperature": NaN}': "bad sampling parameter: temperature must",
    '{"id": "inf", "prompt": "a", "top_p": Infinity}': "bad sampling parameter: top_p must",
    '{"id": "mt", "prompt": "a", "max_tokens": "5"}': "bad sampling parameter: column 'max_tokens'",
    '{"id": "seed", "prompt": "a", "seed": -1}': "bad sampling parameter: seed must be in",
    '{"id": "stop", "prompt": "a", "stop": [1]}': "bad sampling parameter: column 'stop' must",
    '{"id": "huge", "prompt": "a", "max_tokens": 1'
    + "0" * 5000
    + "}": "row 14, line 15: not valid JSON",
    '{"id": "nullmsg", "messages": null}': "messages is null",
}


def write_lines(path, lines: list[str | bytes]) -> None:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))


def read(path, keep=()) -> list[Row]:
    reader = Reader(find_sources([str(path)]), "prompt", "id", keep)
    reader.check()
    return [row for batch in reader.batches() for row in batch]


def test_each_bad_value_is_an_error_record_naming_its_field(tmp_path):
    path = tmp_path / "in.jsonl"
    write_lines(path, [*BAD_LINES, b'{"id": "bytes", "prompt": "\xff\xfe"}', '{"prompt": "ok"}'])
    rows = read(path, keep=("meta",))
    assert len(rows) == len(BAD_LINES) + 2
    for row, expected in zip(rows, BAD_LINES.values(), strict=False):
        assert row.error is not None and row.error.startswith(expected), (row.id, row.error)
    assert rows[-2].error == "row 16, line 17: not valid UTF-8 (invalid start byte at byte 27)"
    assert rows[-1].error is None
    # A bad id leaves the row its default id, so that its record is found by its row number.
    assert [r.id for r in rows[4:7]] == ["in:4", "in:5", "in:6"]
    assert all(r.extra is None or json.dumps(r.extra).encode() for r in rows)


def test_a_null_messages_without_a_prompt_column_says_so_in_parquet_as_in_jsonl(tmp_path):
    pq.write_table(
        pa.table({"messages": pa.array([None], pa.list_(pa.string()))}), tmp_path / "p.parquet"
    )
    write_lines(tmp_path / "j.jsonl", ['{"messages": null}'])
    assert read(tmp_path / "p.parquet")[0].error == read(tmp_path / "j.jsonl")[0].error
    assert read(tmp_path / "p.parquet")[0].error == "messages is null"


def test_sampling_params_refuse_values_the_engine_cannot_take():
    for bad in [dict(temperature=float("nan")), dict(temperature=float("inf")),
                dict(top_k=2**31), dict(top_k=10**20), dict(max_tokens=2**31),
                dict(max_tokens=2.0), dict(seed=2**63), dict(logprobs=2**40),
                dict(min_p=float("nan")), dict(stop_token_ids=[2**40])]:  # fmt: skip
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_a_guard_turns_the_exception_of_one_row_into_its_error_record():
    def stage(rows):
        for row in rows:
            if row.prompt == "boom":
                raise RuntimeError("cannot handle boom")
            row.text = "done"

    guard = RowGuard("the tokenizer stage")
    rows = [Row("a", "fine"), Row("b", "boom"), Row("c", "also fine")]
    assert guard(stage, rows) == rows
    assert [r.text for r in rows] == ["done", None, "done"]
    assert (
        rows[1].error == "the tokenizer stage failed on this row: RuntimeError: cannot handle boom"
    )
    assert guard.faults == 1


def config(tmp_path, model_dir, path, **kw):
    return RunConfig(inputs=(str(path),), out=str(tmp_path / "out"), model=str(model_dir),
                     quiet=True, **kw)  # fmt: skip


def output(out) -> list[dict]:
    return [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_a_stage_that_raises_on_one_row_costs_that_row_only(tmp_path, tiny_model_dir, monkeypatch):
    from bulkgen.text.stage import Tokenize

    original = Tokenize.__call__

    def flaky(self, rows):
        if any(r.prompt == "boom" for r in rows):
            raise RuntimeError("tokenizer bug")
        return original(self, rows)

    monkeypatch.setattr(Tokenize, "__call__", flaky)
    path = tmp_path / "in.jsonl"
    write_lines(path, [json.dumps({"id": str(i), "prompt": p}) for i, p in
                       enumerate(["a", "boom", "b", "c"])])  # fmt: skip
    stats = run(config(tmp_path, tiny_model_dir, path), lambda c: FakeEngine(c))
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert sorted(rows) == ["0", "1", "2", "3"]
    assert (
        rows["1"]["error"] == "the tokenizer stage failed on this row: RuntimeError: tokenizer bug"
    )
    assert [rows[i]["finish_reason"] for i in "023"] == ["stop"] * 3
    assert stats["row_faults"] == 1 and stats["errors"] == 1


def test_a_damaged_gzip_keeps_the_rows_before_the_damage_and_fails_in_one_line(
    tmp_path, tiny_model_dir
):
    data = gzip.compress(b"".join(b'{"prompt": "p %d"}\n' % i for i in range(50000)))
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"cannot read input .*in.jsonl.gz from row (\d+) on") as e:
        run(config(tmp_path, tiny_model_dir, path, shard_size=1000), lambda c: FakeEngine(c))
    first_lost = int(e.value.args[0].split(" from row ")[1].split()[0])
    assert "\n" not in str(e.value) and 0 < first_lost < 50000
    rows = output(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == sorted(f"in:{i}" for i in range(first_lost))
    assert all(r["error"] is None for r in rows)  # no half line read as a bad row


def test_every_bad_row_is_writable_as_jsonl_output_too(tmp_path, tiny_model_dir):
    path = tmp_path / "in.jsonl"
    write_lines(path, [*BAD_LINES, b'{"prompt": "\xff"}', '{"prompt": "ok", "meta": "\\ud800"}'])
    config_ = config(tmp_path, tiny_model_dir, path, format="jsonl", keep_columns=("meta",))
    stats = run(config_, lambda c: FakeEngine(c))
    lines = [
        json.loads(x) for p in (tmp_path / "out").glob("part-*") for x in p.read_text().splitlines()
    ]
    assert len(lines) == stats["rows"] == len(BAD_LINES) + 2
    assert all(r["finish_reason"] == "error" for r in lines) and stats["row_faults"] == 0
    kept = [r for r in lines if r["error"].startswith("column 'meta' holds")][0]
    assert kept["meta"] == "\\ud800"  # written with a backslash escape, said in the README
