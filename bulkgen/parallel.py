"""Data parallelism: N engine workers, each running the whole pipeline on its share of the rows.

    bulkgen run ... --data-parallel 2      one process per GPU, N CPU ones without (parallel_local)
    bulkgen run ... --ray auto --gpus all  the workers as Ray actors (parallel_ray.py)

A row belongs to worker blake2b(id) mod N. Each worker writes its own shards, part-wII-NNNNN, into
the shared output folder and numbers them after its own complete ones; it skips the rows that any
complete shard holds, whoever wrote it, so a rerun resumes whatever N it has. The parent checks,
locks and prepares the folder once, shows one progress bar from the counts the workers send it,
and writes one stats.json. A worker that fails fails the job: the others are stopped and its
error is raised; the rows of complete shards stay done. This module holds what both kinds of
worker share: the split of the rows, a worker's view of the folder, the job's stats.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bulkgen.errors import UserError
from bulkgen.io.fence import Fenced, claim_attempt, is_current
from bulkgen.io.job import TEMP_PREFIX, Done, JobDir
from bulkgen.progress import Counts
from bulkgen.row import Row
from bulkgen.run_config import RunConfig

# A worker's stats that are the job's, not its own: stats.json's "workers" list leaves them out.
_JOB_STATS = ("rows", "errors", "prompt_tokens", "completion_tokens", "shards", "model",
              "model_path", "sampling", "format", "bulkgen_version")  # fmt: skip


def owner(row_id: str, count: int) -> int:
    """The worker a row belongs to: the same in every run and on every machine (not hash())."""
    digest = hashlib.blake2b(row_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % count


@dataclass
class Share:
    """Worker `index` of `count`, as the pipeline sees it (pipeline.run's worker argument)."""

    index: int
    count: int
    report: Callable[[Counts], None] | None = None  # the counts of each batch of rows written
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

    def keep(self, resume: Callable[[list[Row]], list[Row]]) -> Callable[[list[Row]], list[Row]]:
        """The reader's row filter: this worker's rows, less those done (resume)."""

        def keep(rows: list[Row]) -> list[Row]:
            return resume([row for row in rows if owner(row.id, self.count) == self.index])

        return keep

    def start(self, job: JobDir) -> Done:
        if self.ready is not None:
            self.ready()
        # An earlier attempt of this worker (a restarted Ray actor) may have left half-written
        # shards. Only its own: the other workers are writing theirs now.
        for path in job.path.glob(f"{TEMP_PREFIX}w{self.index:02d}-*"):
            path.unlink(missing_ok=True)
        self.folder = job.path
        self.attempt = claim_attempt(job.path, self.index)
        return job.scan(self.prefix)


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
    from bulkgen.preflight import bulkgen_version

    run = Counts(
        end.rows - start.rows,
        end.errors - start.errors,
        end.prompt_tokens - start.prompt_tokens,
        end.completion_tokens - start.completion_tokens,
    )
    return {
        "rows": end.rows,
        "errors": end.errors,
        "prompt_tokens": end.prompt_tokens,
        "completion_tokens": end.completion_tokens,
        "shards": len(end.shards),
        "this_run": {
            "rows": run.rows,
            "errors": run.errors,
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "resumed_after_rows": start.rows,
        },
        "wall_time_s": round(wall, 3),
        "load_time_s": round(load_time, 3),
        "generated_tokens_per_s": round(run.completion_tokens / max(wall, 1e-9), 1),
        "model": config.model,
        "model_path": str(model_dir),
        "sampling": config.job_settings()["sampling"],
        "format": config.format,
        "bulkgen_version": bulkgen_version(),
    }


def worker_list(worker_stats: dict[int, dict]) -> list[dict]:
    """Each worker's own figures (its engine's included), for stats.json's "workers"."""
    return [
        {"worker": i, **{k: v for k, v in stats.items() if k not in _JOB_STATS}}
        for i, stats in sorted(worker_stats.items())
    ]
