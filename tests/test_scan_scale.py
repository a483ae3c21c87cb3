"""What a run reads of a job's complete shards: a job of thousands of shards must not be read
whole again at the end of every run (its stats count the shards the run wrote)."""

from __future__ import annotations

import json

from test_pipeline import factory, make_config, write_jsonl

from bulkgen.io import job as job_module
from bulkgen.io.writer import ShardWriter
from bulkgen.pipeline import run


def test_the_end_of_a_run_reads_only_the_shards_it_wrote(tmp_path, tiny_model_dir, monkeypatch):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p {i}"} for i in range(40)])
    config = make_config(tmp_path, tiny_model_dir, [path], shard_size=5)
    run(config, factory())
    shards = sorted((tmp_path / "out").glob("part-*"))
    shards[2].unlink()
    old = {p.name for p in shards} - {shards[2].name}
    written, read_after = [], []
    flush, read_summary = ShardWriter.flush, job_module.read_summary

    def flushed(self):
        flush(self)
        written.append(True)

    def read(path):
        if written:
            read_after.append(path.name)
        return read_summary(path)

    monkeypatch.setattr(ShardWriter, "flush", flushed)
    monkeypatch.setattr(job_module, "read_summary", read)
    stats = run(config, factory())
    assert read_after and not set(read_after) & old
    assert stats["rows"] == 40 and stats["shards"] == 8
    assert stats["this_run"]["rows"] == 5 and stats["this_run"]["resumed_after_rows"] == 35
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["rows"] == 40
