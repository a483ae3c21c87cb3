"""The start of a rerun: a one-process job's shards are not read for repeated rows (only data-
parallel workers' shards can repeat one: tests/test_fence.py), so a job of thousands of shards
is not read whole once more before each rerun generates."""

from __future__ import annotations

from test_pipeline import factory, make_config, output, write_jsonl

from bulkgen.io import fence
from bulkgen.pipeline import run


def test_a_rerun_of_a_one_process_job_reads_no_shard_for_repeats(
    tmp_path, tiny_model_dir, monkeypatch
):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p {i}"} for i in range(40)])
    config = make_config(tmp_path, tiny_model_dir, [path], shard_size=5)
    run(config, factory())
    (tmp_path / "out" / "part-00002.parquet").unlink()
    read = []
    keys = fence._keys
    monkeypatch.setattr(fence, "_keys", lambda path: read.append(path) or keys(path))
    stats = run(config, factory())
    assert read == []
    assert stats["rows"] == 40 and stats["this_run"]["rows"] == 5
    assert sorted(r["id"] for r in output(tmp_path / "out")) == sorted(f"in:{i}" for i in range(40))
