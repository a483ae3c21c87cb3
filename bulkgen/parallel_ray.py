"""Data-parallel workers as Ray actors: `bulkgen run ... --ray [ADDRESS]` (bulkgen[ray]).

Ray starts, places and restarts the workers; bulkgen adds no cluster manager. Each actor (one GPU,
or one CPU on a cluster without GPUs) runs the pipeline on the rows the driver hands it, as a
worker process does (parallel.py, work_sharing.py): the driver reads the rows and puts batches on
a Ray queue per actor as each has room; the actors send what they write back on one queue. They
write part-wII-* shards into --out, which every node must share. When an actor or its node dies,
Ray restarts it (max_restarts) and calls its run again (max_task_retries): the new attempt
discards the half-written shards of the dead one and announces itself; the driver hands out
again the dead attempt's rows that no complete shard holds, so each row ends up in exactly one
shard. The driver (this process) checks, locks and prepares the folder, shows the progress bar
and writes stats.json.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.errors import UserError
from bulkgen.io.fingerprint import fingerprints
from bulkgen.io.job import JobDir
from bulkgen.parallel import (
    Share,
    add_workers,
    dispatcher,
    finish,
    job_stats,
    sharing_stats,
    worker_count,
)
from bulkgen.progress import Progress
from bulkgen.run_config import RunConfig
from bulkgen.work_sharing import Dispatcher, Feed

# Ray retries a worker this many times; each retry resumes from the complete shards.
MAX_RESTARTS = 4
_POLL_S = 0.1


def actor_name(out: str, index: int) -> str:
    """The Ray name of a job's worker actor (one job per folder: the folder is locked)."""
    return f"bulkgen:{Path(out).resolve()}:w{index:02d}"


class RayWorker:
    """A worker actor. Made with ray.remote(RayWorker) only when --ray is used."""

    def run(self, index: int, count: int, config: RunConfig, messages, feed) -> dict:
        """The pipeline on the rows the driver puts on feed; what it writes goes on messages."""
        from ray.util.queue import Empty

        from bulkgen import pipeline

        def send(kind: str, attempt: int | None, value: object) -> None:
            messages.put((kind, index, attempt, value))

        def take(timeout: float) -> tuple | None:
            try:
                return feed.get(timeout=timeout)
            except Empty:
                return None

        stats = pipeline.run(config, worker=Share(index, count, send, Feed(take)))
        stats["ended_at"] = time.time()  # for the gap between the workers' ends (stats.json)
        return stats


def run_ray(config: RunConfig, workers: int | str | None, address: str | None) -> dict:
    try:
        import ray
        from ray.util.queue import Queue
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'bulkgen[ray]'") from None
    from bulkgen import preflight, ray_placement

    job = JobDir(config.out)
    job.check(config.job_settings(), config.overwrite)
    reader, model_dir, _, _ = preflight.checked_parts(config)
    current = fingerprints(reader.sources)
    reader.recorded_first(job.check_inputs(current, config.allow_changed_input, config.overwrite))
    total = reader.count()
    connected = ray.is_initialized()
    if not connected:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise UserError(f"--ray {address or ''}: cannot reach a Ray cluster: {e}") from e
    actors: list = []
    queues: list = []
    group = None  # the placement group of tensor-parallel workers (ray_placement.py)
    try:
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0)) if config.device != "cpu" else 0
        tp = config.tensor_parallel  # each worker a group of tp GPUs on one node
        if tp > 1:  # as many groups as the nodes hold; a placement group reserves them
            nodes = ray.nodes()
            if gpus:  # no node has tp GPUs: that first, before how many groups to run
                ray_placement.check_fit(nodes, 1, tp, True)
            room = sum(ray_placement.groups_per_node(nodes, tp, True)) if gpus else 0
            count = worker_count(workers, room, "the Ray cluster")
            group = ray_placement.reserve(ray, count, tp, bool(gpus))
        else:
            count = worker_count(workers, gpus, "the Ray cluster")
            slots = gpus or int(resources.get("CPU", 0))
            if count > slots:  # an autoscaling cluster may add nodes; a fixed one never does
                print(f"bulkgen: {count} workers, the Ray cluster has {slots} now", flush=True)
        start = preflight.take_folder(job, config, model_dir, reader)
        messages = Queue(actor_options={"num_cpus": 0})
        feeds = [Queue(actor_options={"num_cpus": 0}) for _ in range(count)]
        queues = [messages, *feeds]
        worker_config = dataclasses.replace(
            config,
            quiet=True,
            overwrite=False,
            device="cuda" if gpus else config.device,
            # Actors run in folders of Ray's: paths relative to ours would miss. Row ids do not
            # change (a source is named after the file, or its path below a folder or glob).
            inputs=tuple(os.path.abspath(path) for path in config.inputs),
            out=os.path.abspath(config.out),
            model=str(model_dir.resolve()) if Path(config.model).is_dir() else config.model,
        )
        options = {
            "num_cpus": 1,
            "num_gpus": 1 if gpus else 0,
            "max_restarts": MAX_RESTARTS,
            "max_task_retries": MAX_RESTARTS,
        }
        options["runtime_env"] = {"env_vars": actor_env()}  # the tp ranks inherit it
        remote = ray.remote(RayWorker)

        def hand(i: int, attempt: int, rows: list | None) -> None:
            feeds[i].put((attempt, rows))

        sharing = dispatcher(config, job, reader, start, count, hand, total)
        calls = {}
        started_at = time.time()
        for i in range(count):
            if group is not None:  # worker i in bundle i: tp GPUs of one node
                options.update(ray_placement.actor_options(group, i, tp, bool(gpus)))
            actor = remote.options(name=actor_name(config.out, i), **options).remote()
            actors.append(actor)
            calls[actor.run.remote(i, count, worker_config, messages, feeds[i])] = i
        progress = Progress(
            total and total * config.n, start.rows, start.errors, config.quiet, n=config.n
        )
        worker_stats = _wait(ray, calls, messages, sharing, progress, config.out)
        wall = progress.counts.elapsed
        progress.close()
        job.drop_duplicates()  # a fenced attempt's shard that slipped in (io/fence.py)
        stats = job_stats(config, model_dir, job, start, wall, 0.0)
    except BaseException:  # an actor that cannot load the model fails the job after job.json
        job.forget_if_empty()
        raise
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        for q in queues:
            q.shutdown(force=True)
        if group is not None:
            from ray.util import remove_placement_group

            remove_placement_group(group)
        if not connected:
            ray.shutdown()
        job.unlock()
    # The actors load their engines while the progress bar's clock runs: wall_time_s has it.
    stats["load_time_s"] = round(max(s["load_time_s"] for s in worker_stats.values()), 3)
    add_workers(stats, worker_stats, sharing, started_at, reader)
    stats["data_parallel"] = {
        "workers": count,
        "backend": "ray",
        "gpus": gpus,
        "tensor_parallel": config.tensor_parallel,
        **sharing_stats(stats["workers"], sharing),
    }
    return finish(config, stats, reader)


def actor_env() -> dict[str, str]:
    """Environment variables of every actor: NVLink multicast (NVLS) off, as the GPU machines
    here require of every process we start; in tests, the FakeEngine switch."""
    env = {"NCCL_NVLS_ENABLE": "0"}
    if os.environ.get(FAKE_ENGINE_ENV):  # tests: the actors use the FakeEngine too
        env[FAKE_ENGINE_ENV] = os.environ[FAKE_ENGINE_ENV]
    return env


def _wait(
    ray, calls: dict, messages, sharing: Dispatcher, progress: Progress, out: str
) -> dict[int, dict]:
    """Until every actor's run has returned, handing out rows and feeding the progress bar; a
    UserError if one fails for good (its own error, or Ray's restarts ran out)."""
    pending = list(calls)
    results: dict[int, dict] = {}
    while pending:
        finished, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
        for ref in finished:
            i = calls[ref]
            try:
                results[i] = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                cause = e.cause
                if isinstance(cause, UserError):
                    raise UserError(f"data-parallel worker {i}: {cause}") from None
                raise UserError(
                    f"data-parallel worker {i} failed: {type(cause).__name__}: {cause}; "
                    f"rerun the same command to resume into {out}"
                ) from None
            except ray.exceptions.RayActorError as e:
                raise UserError(
                    f"data-parallel worker {i}: its actor died {MAX_RESTARTS + 1} times "
                    f"({e.__class__.__name__}); rerun the same command to resume into {out}"
                ) from None
        for kind, i, attempt, value in messages.get_nowait_batch(messages.qsize()):
            sharing.receive(kind, i, attempt, value)
            if kind == "rows":
                progress.add_counts(value)
    return results
