"""Fenced retries (io/fence.py): an old and a new attempt of one worker, side by side.

A restarted Ray actor's new attempt and its predecessor, still running on a partitioned node,
are driven here directly (Share.start, ShardWriter): their shards never share a name, the old
one cannot make a shard final once the new one has started, and a shard that slipped in anyway
is reconciled by the driver's scan. No row is duplicated, lost, or silently overwritten.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from bulkgen.io.fence import Fenced
from bulkgen.io.job import JobDir
from bulkgen.io.writer import ShardWriter
from bulkgen.parallel import Share
from bulkgen.row import Row

ROWS = 30


def rows(ids: range) -> list[Row]:
    return [Row(id=f"r{i}", prompt="p", prompt_text="p", text=f"t{i}", finish_reason="stop")
            for i in ids]  # fmt: skip


def attempt(job: JobDir, fence: bool = True) -> tuple[Share, ShardWriter]:
    share = Share(index=1, count=2)
    done = share.start(job)
    writer = ShardWriter(job.path, "parquet", 10, done.next_index, prefix=share.prefix,
                         fence=share.fence if fence else None)  # fmt: skip
    return share, writer


def ids_by_shard(job: JobDir) -> dict[str, list[str]]:
    return {p.name: pq.read_table(p)["id"].to_pylist() for p in sorted(job.path.glob("part-*"))}


@pytest.fixture
def job(tmp_path) -> JobDir:
    job = JobDir(tmp_path / "out")
    job.lock()
    job.prepare({"settings": {}}, overwrite=False)
    return job


def test_an_old_attempt_is_fenced_and_names_never_collide(job):
    old_share, old = attempt(job)
    old.add(rows(range(0, 10)))  # the old attempt's first shard is final
    new_share, new = attempt(job)  # the actor restarts while the old one still runs
    assert (old_share.attempt, new_share.attempt) == (0, 1)
    assert job.scan(new_share.prefix).ids == {f"r{i}" for i in range(10)}  # resumed after it

    with pytest.raises(Fenced, match="attempt 0 was superseded"):
        old.add(rows(range(10, 20)))  # the old attempt's next shard is discarded
    assert not list(job.path.glob(".part-*"))
    new.add(rows(range(10, 30)))
    names = ["part-w01-a00-00000", "part-w01-a01-00000", "part-w01-a01-00001"]
    assert list(ids_by_shard(job)) == [f"{name}.parquet" for name in names]
    assert job.drop_duplicates() == 0
    ids = [i for shard in ids_by_shard(job).values() for i in shard]
    assert sorted(ids) == sorted(f"r{i}" for i in range(ROWS))


def test_a_shard_that_slipped_past_the_fence_is_reconciled_by_the_scan(job):
    _, old = attempt(job, fence=False)  # as if its fence check ran just before the restart
    old.add(rows(range(0, 10)))
    _, new = attempt(job)
    new.add(rows(range(10, 20)))
    before = ids_by_shard(job)
    old.add(rows(range(12, 22)))  # overlaps the new attempt's rows 12-19, adds 20-21
    after_race = ids_by_shard(job)
    assert all(after_race[name] == ids for name, ids in before.items()), "nothing overwritten"
    new.add(rows(range(20, 30)))  # the new attempt did not see 20-21 final when it read them

    assert job.drop_duplicates() == 8 + 2
    ids = [i for shard in ids_by_shard(job).values() for i in shard]
    assert len(ids) == len(set(ids)) == ROWS
    assert set(ids) == {f"r{i}" for i in range(ROWS)}
    kept = ids_by_shard(job)
    assert kept["part-w01-a00-00001.parquet"] == [f"r{i}" for i in range(12, 22)]  # first kept
    assert kept["part-w01-a01-00000.parquet"] == ["r10", "r11"]  # the later copies dropped
    assert job.scan().rows == ROWS


def test_a_shard_holding_only_repeated_rows_is_deleted(job):
    _, old = attempt(job, fence=False)
    old.add(rows(range(0, 10)))
    _, new = attempt(job, fence=False)
    new.add(rows(range(0, 10)))
    assert job.drop_duplicates() == 10
    assert list(ids_by_shard(job)) == ["part-w01-a00-00000.parquet"]
