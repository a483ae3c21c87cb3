"""Work sharing among data-parallel workers: the parent reads the rows once and hands them out
on credit, so every worker keeps its engine full and none holds rows another could be running.

    parent: reader -> resume skip -> Dispatcher --(attempt, rows)--> worker i's Feed -> pipeline
                                          ^                                              |
                                          +--- "start" attempt, "rows" written, "final" ids ---+

Credit: a worker may hold `Credit.rows` input rows: what its engine runs at once (max_num_seqs)
and one batch more, counted in samples with --n. The parent sends it a batch of `Credit.chunk`
rows whenever the rows it handed that worker, less the rows the worker has written, leave room
for one. So when the input runs out each worker holds at most its credit and the workers end
together, within about the time of the last rows they started (with a fixed split of the rows,
the worker with the most work ran on alone). When the number of rows is known, no worker holds
more than an even share of the work left either, so a small job is spread over every worker.

Exactly once: the parent skips the rows that complete shards hold (samples.Resume) and hands
every other row to one worker, once; the worker writes it into its own shards (part-wII-aAA-*,
io/fence.py). Batches are addressed to an attempt of a worker. A restarted worker (a Ray actor)
announces its new attempt and drops the batches meant for the old one; the parent hands out again,
to whichever worker has room, the old attempt's rows that no complete shard holds (it scans them
then), and forgets a worker's rows once a final shard holds them ("final").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bulkgen.channel import Channel
from bulkgen.row import Row
from bulkgen.samples import samples_left

_POLL_S = 0.05


@dataclass(frozen=True)
class Credit:
    """How many input rows a worker may hold, and how many it is handed at a time."""

    rows: int
    chunk: int

    @classmethod
    def for_engine(cls, max_num_seqs: int, n: int) -> Credit:
        """A quarter of the engine's rows per batch: it runs its max_num_seqs with that batch
        queued behind them, and the next one arrives once as many have been written."""
        if max_num_seqs < 1 or n < 1:
            raise ValueError(f"max_num_seqs and n must be >= 1, got {max_num_seqs} and {n}")
        chunk = max(1, max_num_seqs // 4)
        return cls(rows=math.ceil((max_num_seqs + chunk) / n), chunk=math.ceil(chunk / n))


@dataclass
class _Worker:
    """The parent's view of one worker: its current attempt and the rows it holds."""

    attempt: int | None = None  # None until it has started
    open: bool = False  # started, and not yet told that the rows are all out
    held: int = 0  # input rows handed to this attempt, less those it has written
    handed: int = 0  # input rows handed to it in this run, all attempts
    # Rows handed to it that no final shard holds yet: id -> [its rows (more than one if the
    # input repeats the id), their samples not final].
    unwritten: dict[str, list] = field(default_factory=dict)


class Dispatcher:
    """The parent's side: reads the rows as workers need them and hands them out on credit.

    send(worker, attempt, rows) delivers a batch to that attempt of the worker; rows None says
    that no more will come. left_to_do(rows) is the part of the rows that complete shards do not
    hold (a fresh scan of the folder: used only when a worker restarts). expected: about how many
    rows there are to hand out, if known: no worker is handed more than an even share of the
    work left, so a small job is spread over every worker, not taken by the first to start.
    """

    def __init__(
        self,
        batches: Iterator[list[Row]],
        count: int,
        credit: Credit,
        n: int,
        send: Callable[[int, int, list[Row] | None], None],
        left_to_do: Callable[[list[Row]], list[Row]],
        expected: int | None = None,
    ) -> None:
        self._batches = batches
        self.credit = credit
        self._n = n
        self._send = send
        self._left_to_do = left_to_do
        self._pending: deque[Row] = deque()  # read, or handed back by a restart, not handed out
        self._read_all = False
        self._expected = expected
        self._handed = 0  # rows handed out, restarts' included
        self.workers = [_Worker() for _ in range(count)]

    def receive(self, kind: str, index: int, attempt: int | None, value: object) -> None:
        """A worker's message: "start" (value unused), "rows" (its Counts), "final" (the ids of
        the sample rows of a shard it made final). Others are not the dispatcher's."""
        if kind == "start":
            self.started(index, attempt)
        elif kind == "rows":
            self.written(index, attempt, value.inputs)
        elif kind == "final":
            self.final(index, attempt, value)

    def started(self, index: int, attempt: int) -> None:
        worker = self.workers[index]
        if worker.attempt is not None:  # a restart: the old attempt's unwritten rows go again
            again = self._left_to_do([row for rows, _ in worker.unwritten.values() for row in rows])
            self._pending.extendleft(reversed(again))
        worker.attempt, worker.open, worker.held, worker.unwritten = attempt, True, 0, {}
        self.fill()

    def written(self, index: int, attempt: int | None, inputs: int) -> None:
        worker = self.workers[index]
        if attempt == worker.attempt:  # an old attempt's rows are no longer this one's credit
            worker.held -= inputs
            self.fill()

    def final(self, index: int, attempt: int | None, ids: list[str]) -> None:
        worker = self.workers[index]
        if attempt != worker.attempt:
            return
        for row_id in ids:
            entry = worker.unwritten.get(row_id)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del worker.unwritten[row_id]

    def fill(self) -> None:
        """Hand a batch to every started worker with room for one; once every row is out, tell
        each open worker that no more will come."""
        chunk = self.credit.chunk
        for index, worker in enumerate(self.workers):
            while worker.open:
                limit = self._limit()
                room = limit - worker.held
                if room < min(chunk, limit):
                    break
                rows = self._take(min(chunk, room))
                if not rows:
                    break
                worker.held += len(rows)
                worker.handed += len(rows)
                self._handed += len(rows)
                for row in rows:
                    entry = worker.unwritten.setdefault(row.id, [[], 0])
                    entry[0].append(row)
                    entry[1] += samples_left(row, self._n)
                self._send(index, worker.attempt, rows)
        if self._read_all and not self._pending:
            for index, worker in enumerate(self.workers):
                if worker.open:
                    worker.open = False
                    self._send(index, worker.attempt, None)

    def _limit(self) -> int:
        """The rows a worker may hold now: its credit, or its even share of the work left."""
        if self._read_all:
            unhanded = len(self._pending)
        elif self._expected is not None:
            unhanded = max(self._expected - self._handed, len(self._pending))
        else:
            return self.credit.rows
        left = unhanded + sum(w.held for w in self.workers if w.open)
        return max(1, min(self.credit.rows, math.ceil(left / len(self.workers))))

    def _take(self, count: int) -> list[Row]:
        # One row more than asked for: the end of the input is known when the last rows go.
        while len(self._pending) <= count and not self._read_all:
            batch = next(self._batches, None)
            if batch is None:
                self._read_all = True
            else:
                self._pending.extend(batch)
        return [self._pending.popleft() for _ in range(min(count, len(self._pending)))]


class Feed:
    """A worker's side: the batches its parent hands it, put on its pipeline's first channel.

    take(timeout) gives the next (attempt, rows) the parent sent, or None if none came in time.
    """

    def __init__(self, take: Callable[[float], tuple | None]) -> None:
        self._take = take

    def run(self, attempt: int, out: Channel) -> None:
        """The worker's reader stage: until the parent says that the rows are all out."""
        while True:
            item = self._take(_POLL_S)
            if item is None:
                out.check()  # Ctrl-C or a failure elsewhere: stop now
                continue
            addressed, rows = item
            if addressed != attempt:  # meant for an earlier attempt: handed out again
                continue
            if rows is None:
                break
            out.put(rows)
        out.close()
