"""A data-parallel worker's start: the counts and its own shard numbers of a job's complete
shards, not the ids of every row done (the parent leaves those rows out: parallel.py), so N
workers do not each hold a set of the job's ids."""

from __future__ import annotations

from test_pipeline import factory, make_config, write_jsonl

from bulkgen.io.job import JobDir
from bulkgen.parallel import Share
from bulkgen.pipeline import run


def test_a_worker_starts_with_the_jobs_counts_but_not_its_ids(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p {i}"} for i in range(40)])
    stats = run(make_config(tmp_path, tiny_model_dir, [path], shard_size=5), factory())
    job = JobDir(tmp_path / "out")
    done = Share(index=0, count=2).start(job)
    assert done.ids == set() and done.samples == {}
    assert (done.rows, done.errors, len(done.shards)) == (40, 0, 8)
    assert done.completion_tokens == stats["completion_tokens"]
    assert done.next_index == 0  # its own numbering: no shard of this attempt yet
    assert len(job.scan().ids) == 40  # the parent's scan still has them
