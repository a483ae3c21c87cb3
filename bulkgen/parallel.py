"""Data parallelism: N engine workers, each running the whole pipeline on the rows it is handed.

    bulkgen run ... --data-parallel 2      one process per GPU, N CPU ones without (parallel_local)
    bulkgen run ... --ray auto --gpus all  the workers as Ray actors (parallel_ray.py)

The parent reads the rows once and hands them out as the workers have room (work_sharing.py), so
the workers end together. Each worker writes its own shards, part-wII-aAA-NNNNN, into the shared
output folder and numbers them after its own complete ones; the parent skips the rows that any
complete shard holds, whoever wrote it, so a rerun resumes whatever N it has. The parent checks,
locks and prepares the folder once, shows one progress bar from the counts the workers send it,
and writes one stats.json. A worker that fails fails the job: the others are stopped and its
error is raised; the rows of complete shards stay done. This module holds what both kinds of
worker share: a worker's view of the job, the parent's rows, the job's stats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bulkgen.channel import Channel
from bulkgen.config import AUTO_MAX_NUM_SEQS, EngineConfig
from bulkgen.errors import UserError
from bulkgen.io.fence import Fenced, claim_attempt, is_current
from bulkgen.io.job import STATS_FILE, TEMP_PREFIX, Done, JobDir, write_json_atomic
from bulkgen.io.reader import Reader
from bulkgen.progress import Counts
from bulkgen.row import Row
from bulkgen.run_config import RunConfig
from bulkgen.run_stats import job_record
from bulkgen.samples import Resume
from bulkgen.work_sharing import Credit, Dispatcher, Feed

# A worker's stats that are the job's, not its own: stats.json's "workers" list leaves them out.
_JOB_STATS = ("rows", "errors", "prompt_tokens", "completion_tokens", "shards", "model",
              "model_path", "sampling", "format", "bulkgen_version")  # fmt: skip


@dataclass
class Share:
    """Worker `index` of `count`, as the pipeline sees it (pipeline.run's worker argument)."""

    index: int
    count: int
    # To the parent: send(kind, attempt, value), e.g. ("rows", 0, Counts) (work_sharing.py).
    send: Callable[[str, int | None, object], None] | None = None
    feed: Feed | None = None  # the rows the parent hands this worker
    ready: Callable[[], None] | None = None  # called once the engine has loaded; returns when
    # the parent has prepared the folder
    attempt: int | None = None  # claimed in start(): this run of the worker (io/fence.py)
    folder: Path | None = None

    @property
    def prefix(self) -> str:
        """Of this attempt's shard names: part-wII-aAA-NNNNN."""
        return f"w{self.index:02d}-a{self.attempt:02d}-"

    def fence(self) -> None:
        """Raise Fenced if a newer attempt of this worker has started (the writer calls it
        before making a shard final)."""
        if not is_current(self.folder, self.index, self.attempt):
            raise Fenced(
                f"data-parallel worker {self.index}: attempt {self.attempt} was superseded by a "
                "newer one; its unfinished shard is discarded"
            )

    def report(self, counts: Counts) -> None:
        """The counts of a batch of rows written: the parent's progress bar, and credit."""
        self._send("rows", counts)

    def final(self, rows: list[Row]) -> None:
        """A shard holding these (sample) rows is final: the parent forgets them."""
        self._send("final", [row.id for row in rows])

    def take_rows(self, out: Channel) -> None:
        """The worker's reader stage: the rows the parent hands it, less nothing (the parent
        has left out the rows complete shards hold)."""
        self.feed.run(self.attempt, out)

    def start(self, job: JobDir) -> Done:
        if self.ready is not None:
            self.ready()
        # An earlier attempt of this worker (a restarted Ray actor) may have left half-written
        # shards. Only its own: the other workers are writing theirs now.
        for path in job.path.glob(f"{TEMP_PREFIX}w{self.index:02d}-*"):
            path.unlink(missing_ok=True)
        self.folder = job.path
        self.attempt = claim_attempt(job.path, self.index)
        self._send("start", None)  # the parent starts handing this attempt rows
        # Its counts and shard numbers, not the job's ids: the parent leaves out the rows done
        # (each worker held a set of every id, about 120 bytes a row done).
        return job.scan(self.prefix, keep_ids=False)

    def _send(self, kind: str, value: object) -> None:
        if self.send is not None:
            self.send(kind, self.attempt, value)


def dispatcher(config: RunConfig, job: JobDir, reader: Reader, start: Done, count: int,
               send: Callable[[int, int, list[Row] | None], None],
               total: int | None) -> Dispatcher:  # fmt: skip
    """The parent's rows, read once (less those complete shards held at start), handed out;
    total: the input rows (reader.count()), if known."""
    # One schema for every shard of the job: the one its shards have, else the inputs' (as in
    # pipeline.py); the workers' writers find the same.
    reader.keep_types = job.kept_types(config.keep_columns) or reader.keep_schema()
    resume = Resume(start, config.n)
    batches = (kept for batch in reader.batches() if (kept := resume(batch)))
    max_num_seqs = config.max_num_seqs or EngineConfig.max_num_seqs
    if max_num_seqs == "auto":  # the most an engine may run at once; the even-share limit
        max_num_seqs = AUTO_MAX_NUM_SEQS  # keeps a small job spread over the workers
    credit = Credit.for_engine(max_num_seqs, config.n)

    def left_to_do(rows: list[Row]) -> list[Row]:
        return Resume(job.scan(), config.n)(rows)

    expected = None if total is None else max(0, total - len(start.ids))
    return Dispatcher(batches, count, credit, config.n, send, left_to_do, expected)


def worker_devices(gpus: list[str], count: int, per_worker: int = 1) -> list[list[str]]:
    """The GPUs of each worker: worker i has gpus[i*per_worker:(i+1)*per_worker] (a group of
    several, for a worker of its own tensor-parallel ranks); none on the CPU."""
    if not gpus:
        return [[] for _ in range(count)]
    if count * per_worker > len(gpus):
        raise UserError(
            f"--data-parallel {count}: {count * per_worker} GPUs needed, this machine has "
            f"{len(gpus)}"
        )
    return [gpus[i * per_worker : (i + 1) * per_worker] for i in range(count)]


def parse_workers(value: str | None) -> int | str | None:
    """--data-parallel's value: a count, "all", or None when not given."""
    if value is None or value == "all":
        return value
    try:
        count = int(value)
    except ValueError:
        raise ValueError(
            f"--data-parallel takes a number of workers or 'all', got {value!r}"
        ) from None
    if count < 1:
        raise ValueError(f"--data-parallel must be >= 1, got {count}")
    return count


def worker_count(workers: int | str | None, gpus: int, where: str) -> int:
    if isinstance(workers, int):
        return workers
    if gpus == 0:
        raise UserError(
            f"{'--gpus all' if workers else '--ray'}: {where} has no GPU; pass the number of "
            "workers, e.g. --data-parallel 2"
        )
    return gpus


def run_parallel(config: RunConfig, workers: int | str | None, ray_address: str | None) -> dict:
    """Run the job with data-parallel workers: Ray actors if ray_address is not None (""
    means Ray's default: RAY_ADDRESS, else a local Ray), else processes on this machine."""
    if ray_address is not None:
        from bulkgen.parallel_ray import run_ray

        no_device_index(config)
        return run_ray(config, workers, ray_address or None)
    from bulkgen.parallel_local import run_local

    return run_local(config, workers)


def no_device_index(config: RunConfig) -> None:
    if config.device.startswith("cuda:"):
        raise UserError(
            f"--device {config.device} picks one GPU; leave it out to give each worker its own"
        )


def job_stats(config, model_dir, job: JobDir, start: Done, wall: float, load_time) -> dict:
    """stats.json of a data-parallel job, from what complete shards held at its start and hold
    now: exact, though a restarted Ray actor sends the progress bar some rows twice."""
    end = job.scan()
    run = Counts.between(start, end)
    return job_record(config, model_dir, start, run, len(end.shards), wall, load_time)


def add_workers(stats: dict, worker_stats: dict[int, dict], sharing: Dispatcher,
                started_at: float, reader: Reader) -> None:  # fmt: skip
    """stats.json's "workers": each worker's own figures (its engine's included), with the input
    rows it was handed and when it ended, end_s seconds after started_at (the parent's time.time()
    when it began handing out rows; a worker's clock is its machine's); and the job's row_faults,
    the parent reader's and the workers'."""
    workers = []
    for i, own in sorted(worker_stats.items()):
        entry = {k: v for k, v in own.items() if k not in _JOB_STATS and k != "ended_at"}
        entry["rows_handed"] = sharing.workers[i].handed
        if "ended_at" in own:
            entry["end_s"] = round(own["ended_at"] - started_at, 3)
        workers.append({"worker": i, **entry})
    stats["workers"] = workers
    stats["row_faults"] = reader.faults + sum(w.get("row_faults", 0) for w in workers)


def sharing_stats(workers: list[dict], sharing: Dispatcher) -> dict:
    """stats.json's data_parallel figures of the work sharing: how far apart the workers ended."""
    ends = [w["end_s"] for w in workers if "end_s" in w]
    gap = round(max(ends) - min(ends), 3) if ends else None
    return {"credit_rows": sharing.credit.rows, "end_gap_s": gap}


def finish(config: RunConfig, stats: dict, reader: Reader) -> dict:
    """Write the job's stats.json; a UserError if an input broke midway (the rows before the
    damage are written, but the run failed), as a run without workers does."""
    write_json_atomic(Path(config.out) / STATS_FILE, stats)
    if reader.damaged:
        more = len(reader.damaged) - 1
        raise UserError(reader.damaged[0] + (f" (and {more} more inputs)" if more else ""))
    return stats
