"""Kept columns of Arrow types a Parquet shard holds but Python values do not rebuild (extension
types: bool8, a fixed_shape_tensor with a permutation) are written as read, and types a Parquet
shard cannot hold (unions, month_day_nano intervals) are one line before any work (both were a
traceback at the first shard, or every row a write error record)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from test_job_inputs import bulkgen, fake_engine, output  # noqa: F401 (fake_engine: a fixture)


def test_extension_typed_kept_columns_are_written_as_read(tmp_path, tiny_model_dir):
    emb = pa.FixedShapeTensorArray.from_numpy_ndarray(
        np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    )
    flag = pa.array([1, 0], pa.int8()).cast(pa.bool8())
    table = pa.table({"id": ["a", "b"], "prompt": ["x", "y"], "emb": emb, "flag": flag})
    pq.write_table(table, tmp_path / "in.parquet")
    out = tmp_path / "out"
    result = bulkgen("run", tmp_path / "in.parquet", "-m", tiny_model_dir, "-o", out, "-q",
                     "--keep-columns", "emb,flag")  # fmt: skip
    assert result.exit_code == 0, result.output
    written = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("part-*.parquet")))
    assert written.column("error").to_pylist() == [None, None]
    assert written.column("emb").combine_chunks().equals(emb)
    assert written.column("flag").combine_chunks().equals(flag)


def test_a_kept_type_parquet_cannot_hold_is_one_line_unless_jsonl(tmp_path, tiny_model_dir):
    folder = tmp_path / "ds"  # the datasets library's save_to_disk layout
    folder.mkdir()
    union = pa.UnionArray.from_sparse(
        pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])]
    )
    interval = pa.array([pa.MonthDayNano([1, 2, 3])] * 2, pa.month_day_nano_interval())
    table = pa.table({"id": ["a", "b"], "prompt": ["x", "y"], "un": union, "iv": interval})
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as f:
        with pa.ipc.new_stream(f, table.schema) as writer:
            writer.write_table(table)
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}
    (folder / "state.json").write_text(json.dumps(state))
    for column in ("un", "iv"):
        out = tmp_path / f"out_{column}"
        result = bulkgen("run", folder, "-m", tiny_model_dir, "-o", out, "--keep-columns", column)
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert f"a Parquet shard cannot hold {column} (" in result.output
        assert "--format jsonl" in result.output and not out.exists()
    result = bulkgen("run", folder, "-m", tiny_model_dir, "-o", tmp_path / "jsonl", "-q",
                     "--keep-columns", "un,iv", "--format", "jsonl")  # fmt: skip
    assert result.exit_code == 0, result.output
