"""bulkgen run: reader -> tokenizer -> engine -> detokenizer -> writer, threads and bounded queues.

Everything a user can get wrong (inputs, columns, model, output folder) is checked before the
first thread starts, so such a mistake leaves no shards. Once running, an exception in any stage
sets the shared stop event; every queue operation watches it, so all stages wind down promptly
and the first error is raised from run(). Completed rows still buffered by the writer are written
out then, because they are whole results; a rerun resumes after them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bulkgen import stages
from bulkgen.channel import Channel, Stopped
from bulkgen.config import EngineConfig
from bulkgen.engine.gc_policy import survivors_frozen
from bulkgen.errors import UserError
from bulkgen.guard import RowGuard
from bulkgen.idle import idle_stats, nothing_left
from bulkgen.io.fingerprint import fingerprints
from bulkgen.io.job import STATS_FILE, JobDir, write_json_atomic
from bulkgen.io.reader import Reader
from bulkgen.io.writer import ShardWriter
from bulkgen.preflight import checked_parts, checked_reader, take_folder, vocab_size
from bulkgen.progress import Progress
from bulkgen.run_config import RunConfig
from bulkgen.run_stats import run_stats
from bulkgen.samples import Resume, Samples
from bulkgen.text.stage import Detokenize, Tokenize
from bulkgen.text.stop import StopWatcher
from bulkgen.text.token_bytes import TokenBytes

if TYPE_CHECKING:
    from bulkgen.engine.interface import GenerationEngine

EngineFactory = Callable[[EngineConfig], "GenerationEngine"]
# Queue sizes, in batches. The engine's output queue is the largest: the engine must never wait
# on the text stages.
_READ_QUEUE, _TOKEN_QUEUE, _RESULT_QUEUE, _WRITE_QUEUE = 4, 8, 256, 16
_ENGINE_START_TIMEOUT_S = 3600.0
_JOIN_TIMEOUT_S = 60.0  # for the stages to stop; an engine step on a CPU can take seconds
_SWITCH_INTERVAL_S = 0.0005


def run(config: RunConfig, engine_factory: EngineFactory | None = None, worker=None) -> dict:
    """Run the job in config; return the stats also written to DIR/stats.json.

    worker: a data-parallel worker's Share of the job (bulkgen/parallel.py); its parent checks,
    locks and prepares the folder and writes stats.json.
    """
    job = JobDir(config.out)
    if worker is None:
        job.check(config.job_settings(), config.overwrite)
    reader = checked_reader(config)
    if worker is None:
        current = fingerprints(reader.sources)
        reader.recorded_first(
            job.check_inputs(current, config.allow_changed_input, config.overwrite)
        )
        if (reason := nothing_left(config, job, reader)) is not None:
            return idle_stats(config, job, reason, current)  # the model is not even loaded
    reader, model_dir, tokenizer, tokenize = checked_parts(config, reader)
    try:
        return _Run(config, job, reader, model_dir, tokenizer, tokenize, worker).go(
            engine_factory or _default_engine_factory()
        )
    finally:
        job.unlock()


class _Run:
    """The threads of one run and what they share: the stop event and the first failure."""

    def __init__(self, config, job, reader, model_dir, tokenizer, tokenize, worker=None) -> None:
        self.config: RunConfig = config
        self.worker = worker  # a data-parallel worker's Share, or None for the whole job
        self.job: JobDir = job
        self.reader: Reader = reader
        self.model_dir: Path = model_dir
        self.tokenize: Tokenize = tokenize
        self.token_bytes = TokenBytes(tokenizer)  # logprobs' token names, --format openai's bytes
        self.detokenize = Detokenize(tokenizer, self.token_bytes.name)
        self.vocab_size = vocab_size(model_dir, tokenizer)  # rows' logprobs may ask this many
        self.guards = [RowGuard("the tokenizer stage"), RowGuard("the detokenizer")]
        self.stop = threading.Event()
        self.watcher = StopWatcher(self.detokenize.decode, self.stop)
        self.failure: BaseException | None = None
        self.engine_ready = threading.Event()
        self.engine_stats: dict = {}
        # Set when a stage's thread ends. Waited on before Thread.join: a Ctrl-C that lands
        # inside join() can mark a live thread as finished (Python 3.11, bpo-45274's fix).
        self.ended: list[threading.Event] = []
        self.threads: list[threading.Thread] = []

    def go(self, engine_factory: EngineFactory) -> dict:
        load_start = time.perf_counter()
        # The engine thread releases the GIL while it waits for the device, and must get it back
        # at once when the step lands: with Python's default 5 ms switch interval, a reader,
        # tokenizer or writer thread running Python kept it waiting up to 5 ms per step.
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
        progress: Progress | None = None
        rows_in = Channel(_READ_QUEUE, self.stop)
        requests = Channel(_TOKEN_QUEUE, self.stop)
        results = Channel(_RESULT_QUEUE, self.stop)
        to_write = Channel(_WRITE_QUEUE, self.stop)
        try:
            # The engine loads first: a bad model must fail before anything is written. The
            # rows are counted meanwhile.
            self._spawn("engine", self._engine_thread, engine_factory, requests, results)
            total = self.reader.count() if self.worker is None else None
            if total is not None:
                # Progress counts samples; a batch file's rows may each ask for their own n.
                total = None if self.reader.has_batch_files() else total * self.config.n
            self._wait_for_engine()
            load_time = time.perf_counter() - load_start
            if self.worker is None:
                done = take_folder(self.job, self.config, self.model_dir, self.reader)
            else:  # the parent has prepared the folder; the worker scans it for its share
                done = self.worker.start(self.job)
            report = None if self.worker is None else self.worker.report
            progress = Progress(
                total,
                done.rows,
                done.errors,
                self.config.quiet,
                report,
                self._live_tokens,
                n=self.config.n,
            )
            batch_files = self.reader.has_batch_files()  # their rows may ask for n, logprobs
            # One schema for every shard of the job: the one its shards have, else the inputs'.
            keep_types = self.job.kept_types(self.config.keep_columns)
            self.reader.keep_types = keep_types or self.reader.keep_schema()
            writer = ShardWriter(
                Path(self.config.out),
                self.config.format,
                self.config.shard_size,
                done.next_index,
                self.config.keep_columns,
                samples=self.config.n > 1 or batch_files,
                logprobs=self.config.sampling.logprobs is not None or batch_files,
                model=self.config.model,
                prefix="" if self.worker is None else self.worker.prefix,
                fence=None if self.worker is None else self.worker.fence,
                final=None if self.worker is None else self.worker.final,
                token_ids=self.config.output_token_ids,
                keep_types=self.reader.keep_types,
                token_bytes=self.token_bytes,
            )
            seed = self.job.job_seed()
            samples = Samples(self.config.sampling, self.config.n, seed, self.vocab_size)
            if self.worker is None:
                resume = Resume(done, self.config.n)
                self._spawn("reader", stages.read, self.reader, resume, rows_in)
            else:  # the parent reads the rows and hands them out (work_sharing.py)
                self._spawn("reader", self.worker.take_rows, rows_in)
            tokenizer_guard, detokenizer_guard = self.guards
            self._spawn(
                "tokenizer",
                stages.tokenize,
                self.tokenize,
                samples,
                rows_in,
                requests,
                tokenizer_guard,
            )
            self._spawn("stop-watcher", self.watcher.run)
            self._spawn(
                "detokenizer",
                stages.detokenize,
                self.detokenize,
                results,
                to_write,
                detokenizer_guard,
            )
            writer_ended = self._spawn("writer", stages.write, writer, progress, to_write)
            while not writer_ended.wait(0.1):
                pass
            progress.close()
            self._join_all()
        except BaseException:  # KeyboardInterrupt included: stop every stage before leaving
            self.stop.set()
            self._join_all()
            if progress is not None:
                progress.close()
            raise
        finally:
            sys.setswitchinterval(switch_interval)
        if self.failure is not None:
            raise self.failure
        faults = self.reader.faults + sum(g.faults for g in self.guards) + writer.faults
        # The counts as a resume takes them, of this run's own shards (it holds the lock).
        added = None if self.worker else self.job.counted(writer.shards)
        stats = run_stats(self.config, self.model_dir, done, progress.counts, len(writer.shards),
                          faults, load_time, self.engine_stats, added)  # fmt: skip
        if self.worker is None:
            write_json_atomic(Path(self.config.out) / STATS_FILE, stats)
        if self.reader.damaged:  # the rows before the damage are written; the run still failed
            more = len(self.reader.damaged) - 1
            raise UserError(self.reader.damaged[0] + (f" (and {more} more inputs)" if more else ""))
        return stats

    def _spawn(self, name: str, fn, *args) -> threading.Event:
        ended = threading.Event()

        def body() -> None:
            try:
                fn(*args)
            except Stopped:
                pass
            except BaseException as e:
                if self.failure is None:
                    self.failure = e
                self.stop.set()
            finally:
                ended.set()

        self.ended.append(ended)
        # daemon: a stage stuck past _join_all's timeout must not hold the process open (the
        # CLI then ends it with os._exit; see exits.py).
        thread = threading.Thread(target=body, name=f"bulkgen-{name}", daemon=True)
        self.threads.append(thread)
        thread.start()
        return ended

    def _join_all(self) -> None:
        """Wait for every stage's thread to end: none may be alive when the interpreter
        finalizes, or the C++ under it can abort the process (see exits.py)."""
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for ended, thread in zip(self.ended, self.threads, strict=True):
            if ended.wait(timeout=max(0.0, deadline - time.monotonic())):
                thread.join(timeout=1.0)  # it is returning: only its frames are left

    def _wait_for_engine(self) -> None:
        deadline = time.monotonic() + _ENGINE_START_TIMEOUT_S
        while not self.engine_ready.wait(0.1):
            if self.failure is not None or time.monotonic() > deadline:
                self._join_all()
                if isinstance(self.failure, ValueError | FileNotFoundError):
                    raise UserError(f"cannot load model {self.config.model}: {self.failure}")
                raise self.failure or TimeoutError("the engine did not start")

    def _live_tokens(self) -> int | None:
        """The engine's generated-token count (an int read across threads; None if unknown)."""
        return getattr(getattr(self, "engine", None), "generated_tokens", None)

    def _engine_thread(self, factory: EngineFactory, inp: Channel, out: Channel) -> None:
        # The engine is made here: only the thread that made it may call it (it owns the device).
        engine_config = self.config.engine_config(str(self.model_dir))
        engine = factory(engine_config)
        self.engine = engine
        try:
            self.engine_ready.set()
            bound = 2 * engine_config.seq_rows
            with survivors_frozen():
                stages.generate(engine, inp, out, bound, self.watcher)
            self.engine_stats = dict(engine.stats)
        finally:
            engine.close()
            # Freed here, on its own thread, not by whichever thread drops the last reference
            # (a daemon thread freeing tensors at interpreter exit aborts: see exits.py).
            self.engine = None
            del engine


def _default_engine_factory() -> EngineFactory:
    fake = os.environ.get("BULKGEN_FAKE_ENGINE")
    if fake:  # tests only: see bulkgen/engine/fake.py
        from bulkgen.engine.fake import FakeEngine

        options = json.loads(fake)
        return lambda config: FakeEngine(config, **options)

    def real(config: EngineConfig):
        from bulkgen.engine.engine import Engine
        from bulkgen.engine.model_files import resolve_device

        if resolve_device(config.device).type == "cpu":
            from bulkgen.cpu import use_cpu_threads

            # Before the engine loads: no thread oversubscription (cpu.py).
            use_cpu_threads(config.tensor_parallel)
        return Engine(config)

    return real
