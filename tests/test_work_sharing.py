"""Work sharing (bulkgen/work_sharing.py): the parent hands rows out on credit, each row once.

The Dispatcher is driven here directly, with the messages a worker would send; the worker
processes and Ray actors that send them for real are in test_parallel.py and
test_parallel_ray.py.
"""

from __future__ import annotations

import threading

import pytest

from bulkgen.channel import Channel
from bulkgen.parallel import worker_devices
from bulkgen.parallel_local import _worker_env
from bulkgen.parallel_ray import actor_env
from bulkgen.progress import Counts
from bulkgen.row import Row
from bulkgen.work_sharing import Credit, Dispatcher, Feed


def rows(count: int, start: int = 0) -> list[Row]:
    return [Row(id=f"r{i}", prompt="p") for i in range(start, start + count)]


def batches(count: int, size: int = 7):
    for start in range(0, count, size):
        yield rows(min(size, count - start), start)


class Workers:
    """What the dispatcher sent each worker, as the workers would see it."""

    def __init__(self, count: int) -> None:
        self.got: list[list[tuple[int, list[Row] | None]]] = [[] for _ in range(count)]

    def send(self, index: int, attempt: int, batch: list[Row] | None) -> None:
        self.got[index].append((attempt, batch))

    def ids(self, index: int) -> list[str]:
        return [r.id for _, batch in self.got[index] if batch for r in batch]

    def ended(self, index: int) -> bool:
        return bool(self.got[index]) and self.got[index][-1][1] is None


def dispatcher(total: int, workers: Workers, credit=None, expected=None, done=()) -> Dispatcher:
    """Rows r0.. in batches of 7; done: the ids a rescan finds in complete shards."""
    return Dispatcher(batches(total), len(workers.got), credit or Credit(10, 4), 1, workers.send,
                      lambda rows: [r for r in rows if r.id not in done], expected)  # fmt: skip


def written(count: int) -> Counts:
    return Counts(rows=count, inputs=count)


def test_credit_is_the_engines_rows_and_a_quarter_more_counted_in_samples():
    assert Credit.for_engine(256, 1) == Credit(rows=320, chunk=64)
    assert Credit.for_engine(256, 4) == Credit(rows=80, chunk=16)
    assert Credit.for_engine(1, 1) == Credit(rows=2, chunk=1)
    with pytest.raises(ValueError, match="max_num_seqs and n must be >= 1"):
        Credit.for_engine(0, 1)


def test_a_worker_is_never_handed_more_than_its_credit_and_gets_more_as_it_writes():
    workers = Workers(1)
    sharing = dispatcher(100, workers)
    sharing.receive("start", 0, 0, None)
    assert [len(b) for _, b in workers.got[0]] == [4, 4], "two batches fit in a credit of 10"
    sharing.receive("rows", 0, 0, written(3))  # 5 held: room for 5, one batch of 4
    assert len(workers.ids(0)) == 12 and sharing.workers[0].held == 9
    sharing.receive("rows", 0, 0, written(2))  # 7 held: room for 3 only, less than a batch
    assert len(workers.ids(0)) == 12


def test_every_row_goes_to_one_worker_once_and_each_hears_the_end():
    workers = Workers(3)
    sharing = dispatcher(50, workers)
    for index in range(3):
        sharing.receive("start", index, 0, None)
    turn = 0
    while not all(workers.ended(i) for i in range(3)):  # the workers write in turns
        held = sharing.workers[turn].held
        sharing.receive("rows", turn, 0, written(min(held, 3)))
        turn = (turn + 1) % 3
    ids = [i for index in range(3) for i in workers.ids(index)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(50)) and len(ids) == len(set(ids))
    assert [sharing.workers[i].handed for i in range(3)] == [len(workers.ids(i)) for i in range(3)]


def test_the_worker_that_writes_faster_is_handed_more():
    workers = Workers(2)
    sharing = dispatcher(200, workers)
    sharing.receive("start", 0, 0, None)
    sharing.receive("start", 1, 0, None)
    while not workers.ended(1):
        sharing.receive("rows", 1, 0, written(sharing.workers[1].held))  # writes all it holds
        sharing.receive("rows", 0, 0, written(min(1, sharing.workers[0].held)))  # one at a time
    slow, fast = sharing.workers[0].handed, sharing.workers[1].handed
    assert slow + fast == 200 and fast > 4 * slow


def test_a_small_job_is_spread_over_the_workers_not_taken_by_the_first_to_start():
    workers = Workers(2)
    sharing = dispatcher(12, workers, credit=Credit(320, 64), expected=12)
    sharing.receive("start", 0, 0, None)  # worker 1 is still loading
    assert workers.ids(0) == [f"r{i}" for i in range(6)]
    sharing.receive("start", 1, 0, None)
    assert workers.ids(1) == [f"r{i}" for i in range(6, 12)]
    assert workers.ended(0) and workers.ended(1)


def test_a_restarted_worker_gets_no_rows_twice_and_its_unwritten_rows_go_again():
    workers = Workers(2)
    # A final shard of the old attempt holds r0 and r1: the rescan at the restart finds them.
    sharing = dispatcher(30, workers, done={"r0", "r1"})
    sharing.receive("start", 0, 0, None)
    sharing.receive("rows", 0, 0, written(2))
    sharing.receive("final", 0, 0, ["r0", "r1"])
    old = set(workers.ids(0))  # r0..r11: r0, r1 final; r2..r11 lost with the old attempt
    assert old == {f"r{i}" for i in range(12)}
    sharing.receive("start", 0, 1, None)  # Ray restarted worker 0: attempt 1
    again = [r.id for attempt, b in workers.got[0] if attempt == 1 and b for r in b]
    assert again[:8] == [f"r{i}" for i in range(2, 10)], "its unwritten rows first, in order"
    sharing.receive("rows", 0, 0, written(8))  # a late message of the dead attempt: no credit
    assert sharing.workers[0].held == 8
    sharing.receive("start", 1, 0, None)
    while not (workers.ended(0) and workers.ended(1)):
        for index in (0, 1):
            attempt = sharing.workers[index].attempt
            sharing.receive("rows", index, attempt, written(sharing.workers[index].held))
    new = [r.id for a, b in workers.got[0] if a == 1 and b for r in b] + workers.ids(1)
    assert sorted(new + ["r0", "r1"]) == sorted(f"r{i}" for i in range(30))
    assert len(new) == len(set(new))


def test_a_feed_passes_its_attempts_batches_drops_older_ones_and_stops_at_the_end():
    sent = [None, (0, rows(2)), (1, rows(3, 10)), None, (0, None), (1, rows(1, 20)), (1, None)]
    out = Channel(10, threading.Event())
    Feed(lambda timeout: sent.pop(0)).run(1, out)
    got = []
    while (batch := out.get()) is not None:
        got.append([r.id for r in batch])
    assert got == [["r10", "r11", "r12"], ["r20"]]


def test_every_worker_has_nvlink_multicast_off_and_its_own_gpus():
    assert worker_devices(["3", "5", "6", "7"], 2, per_worker=2) == [["3", "5"], ["6", "7"]]
    assert worker_devices([], 2) == [[], []]
    assert _worker_env(["3", "5"], 2) == {"NCCL_NVLS_ENABLE": "0", "CUDA_VISIBLE_DEVICES": "3,5"}
    assert _worker_env([], 2)["NCCL_NVLS_ENABLE"] == "0"
    assert actor_env()["NCCL_NVLS_ENABLE"] == "0"


def test_a_row_is_forgotten_only_once_a_final_shard_holds_all_its_samples():
    """With --n 3 a row's samples may land in two shards: until the last is final, a restart
    hands the row out again (the rescan then marks the samples already done)."""
    workers = Workers(1)
    sharing = Dispatcher(batches(2), 1, Credit(4, 2), 3, workers.send, lambda rows: rows)
    sharing.receive("start", 0, 0, None)
    sharing.receive("final", 0, 0, ["r0", "r0", "r1", "r1", "r1"])
    assert list(sharing.workers[0].unwritten) == ["r0"]
    sharing.receive("start", 0, 1, None)
    assert [r.id for a, b in workers.got[0] if a == 1 and b for r in b] == ["r0"]
    sharing.receive("final", 0, 1, ["r0", "r0", "r0"])
    assert sharing.workers[0].unwritten == {}
