"""Data-parallel workers as processes on this machine: `bulkgen run ... --data-parallel N`.

The parent spawns N workers (never forks: it may have imported torch), worker i on its own GPUs
(CUDA_VISIBLE_DEVICES, set before it imports torch: GPU i today) or on the CPU. Each loads its
engine and says so; only then does the parent lock and prepare the folder and let them start, so a
bad model fails before anything is written. The parent then reads the rows and hands them out
through a queue per worker as each has room (work_sharing.py); the workers send the counts of the
rows they write through one queue back, for the progress bar and their credit. A worker that dies
or fails ends the job: the parent stops the others and raises its error. A worker ends at once if
the parent dies, so a rerun never meets one still writing. Ctrl-C reaches the parent alone, which
passes it on to each worker once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback

from bulkgen.errors import UserError
from bulkgen.io.fingerprint import fingerprints
from bulkgen.io.job import JobDir
from bulkgen.parallel import (
    Share,
    add_workers,
    dispatcher,
    finish,
    job_stats,
    no_device_index,
    sharing_stats,
    worker_count,
    worker_devices,
)
from bulkgen.progress import Progress
from bulkgen.run_config import RunConfig
from bulkgen.work_sharing import Feed

_POLL_S = 0.1
_INTERRUPT_WAIT_S = 60.0  # for the workers to write out their finished rows after Ctrl-C


def run_local(config: RunConfig, workers: int | str | None) -> dict:
    gpus = _visible_gpus(config)
    tp = config.tensor_parallel  # each worker a tensor-parallel group of tp GPUs (its engine's)
    count = worker_count(workers, len(gpus) // tp, "this machine")
    if gpus and count * tp > len(gpus):
        need = f"--data-parallel {count}" + (f" --tensor-parallel {tp}" if tp > 1 else "")
        raise UserError(f"{need}: this machine has {len(gpus)} GPUs")
    devices = worker_devices(gpus, count, per_worker=tp)
    from bulkgen import pipeline, preflight

    if count == 1:
        return pipeline.run(config)
    no_device_index(config)
    job = JobDir(config.out)
    job.check(config.job_settings(), config.overwrite)
    reader, model_dir, _, _ = preflight.checked_parts(config)
    current = fingerprints(reader.sources)
    reader.recorded_first(job.check_inputs(current, config.allow_changed_input, config.overwrite))
    total = reader.count()
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
    messages = context.Queue()
    feeds = [context.Queue() for _ in range(count)]  # the rows handed to each worker
    go = context.Event()
    worker_config = dataclasses.replace(
        config, quiet=True, overwrite=False, device="cuda" if gpus else config.device
    )
    procs = []
    for i in range(count):
        args = (i, count, worker_config, messages, feeds[i], go)
        # daemon: a worker never outlives the parent's normal exit (_exit_with: nor its death).
        name = f"bulkgen-w{i:02d}"
        procs.append(context.Process(target=_worker_main, args=args, name=name, daemon=True))
    parent = _Parent(procs, messages, feeds, config.out)
    try:
        for proc, gpu_group in zip(procs, devices, strict=True):
            with _environ(_worker_env(gpu_group, count * tp)):
                proc.start()
        parent.wait_for("ready")  # every engine loaded: a bad model fails before any write
        load_time = time.perf_counter() - started
        start = preflight.take_folder(job, config, model_dir, reader)
        sharing = dispatcher(config, job, reader, start, count, parent.hand, total)
        parent.sharing = sharing
        progress = Progress(
            total and total * config.n, start.rows, start.errors, config.quiet, n=config.n
        )
        parent.progress = progress
        started_at = time.time()
        go.set()
        worker_stats = parent.wait_for("done")
        wall = progress.counts.elapsed
        progress.close()
        job.drop_duplicates()  # a fenced attempt's shard that slipped in (io/fence.py)
        stats = job_stats(config, model_dir, job, start, wall, load_time)
        add_workers(stats, worker_stats, sharing, started_at, reader)
    except KeyboardInterrupt:
        parent.interrupt()
        raise
    finally:
        parent.stop()
        job.unlock()
    stats["data_parallel"] = {
        "workers": count,
        "backend": "processes",
        "gpus": gpus,
        **sharing_stats(stats["workers"], sharing),
    }
    return finish(config, stats, reader)


def _visible_gpus(config: RunConfig) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each GPU a worker may take; none when on the CPU."""
    if config.device == "cpu":
        return []
    import torch

    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [d.strip() for d in visible.split(",")][:count]
    return [str(i) for i in range(count)]


class _Parent:
    """The parent's side of the worker processes: their messages and their deaths."""

    def __init__(self, procs, messages, feeds, out: str) -> None:
        self.procs: list = procs
        self.messages = messages
        self.feeds: list = feeds
        self.out = out
        self.progress: Progress | None = None
        self.sharing = None  # the Dispatcher, once the folder is prepared
        self.seen: dict[str, dict[int, object]] = {"ready": {}, "done": {}}
        self.errors: dict[int, str] = {}
        self.user_errors: dict[int, str] = {}

    def wait_for(self, kind: str) -> dict[int, object]:
        """Until every worker has sent a message of this kind; a UserError if one fails."""
        while len(self.seen[kind]) < len(self.procs):
            self._receive(timeout=_POLL_S)
            for i, proc in enumerate(self.procs):
                if proc.exitcode is not None and i not in self.seen["done"]:
                    self._drain()  # its last words may still be in the queue
                    if i not in self.seen["done"]:
                        raise UserError(self._failure(i, proc))
        return self.seen[kind]

    def _receive(self, timeout: float) -> bool:
        try:
            kind, i, attempt, value = self.messages.get(timeout=timeout)
        except queue.Empty:
            return False
        if self.sharing is not None:  # "start", "rows", "final": rows handed out on credit
            self.sharing.receive(kind, i, attempt, value)
        if kind == "rows" and self.progress is not None:
            self.progress.add_counts(value)
        elif kind == "error":
            self.errors[i] = value
        elif kind == "user-error":
            self.user_errors[i] = value
        elif kind in self.seen:
            self.seen[kind][i] = value
        return True

    def hand(self, index: int, attempt: int, rows: list | None) -> None:
        """Send worker index's attempt a batch of rows (None: no more will come)."""
        self.feeds[index].put((attempt, rows))

    def _drain(self) -> None:
        while self._receive(timeout=0.2):
            pass

    def _failure(self, i: int, proc) -> str:
        code = proc.exitcode
        if i in self.user_errors:  # the worker's own one-line message (a bad model, say)
            return f"data-parallel worker {i}: {self.user_errors[i]}"
        if i in self.errors:
            what = self.errors[i]
        elif code < 0:
            what = f"worker process {proc.pid} was killed by {signal.Signals(-code).name}"
        else:
            what = f"worker process {proc.pid} exited with status {code}"
        return (
            f"data-parallel worker {i} failed: {what}; the other workers were stopped. "
            f"Rerun the same command to resume into {self.out}"
        )

    def interrupt(self) -> None:
        """Ctrl-C: each worker writes out its finished rows as on Ctrl-C alone, then ends."""
        for proc in self.procs:
            if proc.exitcode is None and proc.pid is not None:
                os.kill(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + _INTERRUPT_WAIT_S
        while any(p.exitcode is None for p in self.procs if p.pid) and time.monotonic() < deadline:
            self._receive(timeout=_POLL_S)

    def stop(self) -> None:
        for feed in self.feeds:  # rows a dead worker never took must not hold up our exit
            feed.cancel_join_thread()
        for proc in self.procs:
            if proc.exitcode is None and proc.pid is not None:
                proc.terminate()
        for proc in self.procs:
            if proc.pid is not None:
                proc.join(timeout=10)
                if proc.exitcode is None:
                    proc.kill()
                    proc.join()


def _worker_env(gpus: list[str], count: int) -> dict[str, str]:
    """What a worker's environment has from its first instruction, before it imports torch: its
    GPUs; on the CPU, its part of the cores (unless OMP_NUM_THREADS is set already). NVLink
    multicast (NVLS) stays off in every process we start, as the GPU machines here require."""
    env = {"NCCL_NVLS_ENABLE": "0"}
    if gpus:
        return {**env, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    threads = str(max(1, (os.cpu_count() or 1) // count))
    return {**env, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads)}


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """os.environ with these values while a process is spawned (it inherits it), then as before."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _worker_main(index, count, config, messages, feed, go) -> None:
    """A worker process: the pipeline on the rows the parent hands it."""
    # Ctrl-C reaches the parent alone, which passes it on once (see _Parent.interrupt).
    os.setpgrp()
    _exit_with(multiprocessing.parent_process())
    # tqdm would make a multiprocessing lock, which a killed worker leaves to the resource
    # tracker's "leaked semaphore" warning; this process's bar is off anyway.
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())

    def send(kind: str, attempt: int | None, value: object) -> None:
        messages.put((kind, index, attempt, value))

    def ready() -> None:
        send("ready", None, None)
        go.wait()

    def take(timeout: float) -> tuple | None:
        try:
            return feed.get(timeout=timeout)
        except queue.Empty:
            return None

    share = Share(index, count, send, Feed(take), ready)
    from bulkgen import pipeline

    try:
        stats = pipeline.run(config, worker=share)
    except KeyboardInterrupt:
        sys.exit(130)
    except UserError as e:
        send("user-error", share.attempt, str(e))
        sys.exit(1)
    except BaseException as e:
        traceback.print_exc()  # a bug: its trace goes to stderr
        send("error", share.attempt, f"{type(e).__name__}: {e}")
        sys.exit(1)
    if "CUDA_VISIBLE_DEVICES" in os.environ:  # which GPU it was, for stats.json's "workers"
        stats["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    stats["ended_at"] = time.time()  # for the gap between the workers' ends (stats.json)
    send("done", share.attempt, stats)


def _exit_with(parent) -> None:
    """End this process at once if the parent dies: it holds the folder's lock, and a rerun
    must not meet a worker still writing."""

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="bulkgen-parent-watch", daemon=True).start()
