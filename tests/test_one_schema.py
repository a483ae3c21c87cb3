"""Every shard of a job has one schema, so the shards read as one dataset (pyarrow, datasets)."""

from __future__ import annotations

import glob
import json

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from bulkgen.engine.fake import FakeEngine
from bulkgen.pipeline import run
from bulkgen.run_config import RunConfig


def job(tmp_path, model_dir, path, **kw) -> RunConfig:
    return RunConfig(inputs=(str(path),), out=str(tmp_path / "out"), model=str(model_dir),
                     quiet=True, shard_size=2, **kw)  # fmt: skip


def test_a_mixed_type_jsonl_column_is_json_text_in_every_shard(tmp_path, tiny_model_dir):
    path = tmp_path / "in.jsonl"
    metas = [{"a": 1}, 3, "text", [1, 2], None, {"b": {"c": True}}, 2.5]
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "meta": m, "n_": i}) + "\n"
                            for i, m in enumerate(metas)))  # fmt: skip
    run(job(tmp_path, tiny_model_dir, path, keep_columns=("meta", "n_")), lambda c: FakeEngine(c))
    files = sorted(glob.glob(str(tmp_path / "out" / "part-*.parquet")))
    assert len(files) == 4
    assert len({pq.read_schema(f) for f in files}) == 1
    table = ds.dataset(files).to_table()
    assert table.schema.field("meta").type == pa.string()
    assert table.schema.field("n_").type == pa.int64()  # one scalar type keeps its type
    by_prompt = dict(zip(table.column("prompt").to_pylist(), table.column("meta").to_pylist(),
                         strict=True))  # fmt: skip
    assert [by_prompt[f"p{i}"] for i in range(7)] == [
        '{"a": 1}', "3", "text", "[1, 2]", None, '{"b": {"c": true}}', "2.5"]  # fmt: skip
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("parquet", data_files=files, split="train")
    assert loaded.num_rows == 7 and loaded.features["meta"].dtype == "string"


def test_a_later_value_that_does_not_fit_the_column_is_an_error_record(tmp_path, tiny_model_dir):
    path = tmp_path / "in.jsonl"
    rows = [{"prompt": "a", "score": 1}, {"prompt": "b", "score": 2}]
    lines = [json.dumps(r) for r in rows] + [json.dumps({"prompt": "c", "score": 1})] * 100
    lines.append(json.dumps({"id": "late", "prompt": "d", "score": "high"}))  # past the probe
    path.write_text("\n".join(lines) + "\n")
    run(job(tmp_path, tiny_model_dir, path, keep_columns=("score",)), lambda c: FakeEngine(c))
    table = ds.dataset(sorted(glob.glob(str(tmp_path / "out" / "part-*.parquet")))).to_table()
    assert table.schema.field("score").type == pa.int64()
    late = [r for r in table.to_pylist() if r["id"] == "late"][0]
    assert late["error"].startswith("column 'score' holds str here, but the job stores it as int64")


def test_parquet_kept_columns_keep_the_input_schema_and_a_rerun_keeps_the_job_one(
    tmp_path, tiny_model_dir
):
    path = tmp_path / "in.parquet"
    meta = pa.array([{"x": 1}, None, {"x": 3}], pa.struct([("x", pa.int64())]))
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "meta": meta}), path)
    config = job(tmp_path, tiny_model_dir, path, keep_columns=("meta",))
    run(config, lambda c: FakeEngine(c))
    files = sorted((tmp_path / "out").glob("part-*.parquet"))
    files[-1].unlink()
    run(config, lambda c: FakeEngine(c))
    schemas = {pq.read_schema(f).field("meta").type for f in (tmp_path / "out").glob("part-*")}
    assert schemas == {meta.type}
