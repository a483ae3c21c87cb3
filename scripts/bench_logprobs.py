"""Host cost of --logprobs per generated token, and the stalls it gives the engine thread.

Naming (Detokenize) and the Parquet columns run on threads that share the interpreter (the GIL)
with the engine thread, so their Python time is time the engine loop may wait; so is every
full garbage collection, which visits each object the GC tracks and every reference they hold.

- naming / arrow columns: a batch of 64 rows x 544 tokens x top-5 with random ids, as the engine
  gives them; naming is timed cold (every id new to the Detokenize's text cache) and warm (later
  batches with the same ids); each warm figure is the best of 3.
- gc.collect: a full collection while 1,000 such rows are held, as the engine hands them over
  and once named (as the writer buffers a 1,000-row shard).
- stream: 2 shards' rows made, named and written as a job streams them; the collections the
  interpreter ran meanwhile and the worst stall.
- stalls: a thread sleeping 2 ms in a loop (the engine thread's stand-in) records how late it
  wakes while the writer's logprob_columns builds a 1,000-row shard and while _name_tokens
  names 64 rows (the shard's 1,000 named rows held meanwhile, as the writer holds them); the
  worst of 3 calls each, beside a control (the same thread while nothing else runs).

    python scripts/bench_logprobs.py --tokenizer .carry/tokenizer.json
"""

from __future__ import annotations

import argparse
import gc
import threading
import time

import numpy as np
from transformers import PreTrainedTokenizerFast

from bulkgen.engine.token_logprobs import LogprobRecorder
from bulkgen.io.writer import logprob_columns
from bulkgen.row import Row
from bulkgen.text.stage import Detokenize


def batch(rows: int, tokens: int, k: int, seed: int) -> list[Row]:
    """Rows as the engine hands them over (stages._finish), their logprobs recorded a token at a
    time as Scheduler.update does."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        row = Row(id=str(i), prompt="x")
        row.token_ids = rng.integers(1000, 120000, tokens).tolist()
        chosen = (-rng.random(tokens)).tolist()
        top_ids = memoryview(rng.integers(1000, 120000, tokens * k).view(np.uint8))
        top_values = memoryview((-rng.random(tokens * k)).view(np.uint8))
        rec = LogprobRecorder(k)
        for p in range(tokens):
            at = slice(p * k * 8, (p + 1) * k * 8)
            rec.append(chosen[p], top_ids[at], top_values[at])
        row.token_logprobs = rec.freeze()
        out.append(row)
    return out


class StallWatch:
    """A thread that sleeps 2 ms in a loop and keeps the worst lateness of its wake-ups; and the
    longest garbage collection meanwhile (a stall on a loaded machine may also be the OS
    descheduling whichever thread holds the GIL: the collections are this bench's own part)."""

    def __init__(self) -> None:
        self.worst = self.longest_gc = self.gc_total = 0.0
        self.full_collections = 0
        self._gc_start = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            time.sleep(0.002)
            self.worst = max(self.worst, time.perf_counter() - start - 0.002)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_start
            self.longest_gc = max(self.longest_gc, took)
            self.gc_total += took
            self.full_collections += info["generation"] == 2

    def __enter__(self) -> StallWatch:
        self._thread.start()
        time.sleep(0.05)
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on_gc)
        time.sleep(0.05)
        self._stop.set()
        self._thread.join()


def stall(fn, rows: list[Row]) -> tuple[float, float]:
    """The worst wake-up lateness of the stand-in engine thread while fn(rows) runs, and the
    longest collection in that time."""
    with StallWatch() as watch:
        fn(rows)
    return watch.worst, watch.longest_gc


def stream(det: Detokenize, args: argparse.Namespace, shards: int) -> StallWatch:
    """Rows made as the engine makes them, named 64 at a time and buffered into shards whose
    columns are built, as a job streams them: the stand-in engine thread watches throughout."""
    with StallWatch() as watch:
        buffer = []
        for i in range(shards * args.shard // args.rows):
            rows = batch(args.rows, args.tokens, args.k, seed=10 + i)
            det._name_tokens(rows)
            buffer += rows
            if len(buffer) >= args.shard:
                logprob_columns(buffer)
                buffer = []
    return watch


def worst(stalls) -> str:
    late, collection = (max(values) for values in zip(*stalls, strict=True))
    return f"{late * 1e3:.1f} ms (longest collection {collection * 1e3:.1f} ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a tokenizer.json file")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=544)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--shard", type=int, default=1000, help="rows of a shard")
    args = parser.parse_args()
    det = Detokenize(PreTrainedTokenizerFast(tokenizer_file=args.tokenizer))
    n = args.rows * args.tokens
    logprob_columns(batch(1, 1, 1, seed=1))  # pyarrow's first conversion imports its helpers
    rows = batch(args.rows, args.tokens, args.k, seed=0)
    print(f"naming, cold: {timed(det._name_tokens, rows) / n * 1e6:.2f} us/token")
    warm = min(timed(det._name_tokens, batch(args.rows, args.tokens, args.k, 0)) for _ in range(3))
    print(f"naming, warm: {warm / n * 1e6:.2f} us/token")
    arrow = min(timed(logprob_columns, rows) for _ in range(3))
    print(f"arrow columns: {arrow / n * 1e6:.2f} us/token")
    del rows

    print(f"gc.collect, nothing held: {collect_ms():.0f} ms")
    shard = batch(args.shard, args.tokens, args.k, seed=1)
    print(f"gc.collect, {args.shard} rows as the engine hands them: {collect_ms():.0f} ms")
    det._name_tokens(shard)
    print(f"gc.collect, {args.shard} rows named: {collect_ms():.0f} ms")
    # The worst of 3: a stall shows whether a full collection fell inside the call. The control
    # is the lateness of the same thread while this one sleeps (the machine's own noise).
    control = worst(stall(lambda _: time.sleep(0.5), []) for _ in range(3))
    print(f"stall, control (0.5 s asleep): {control}")
    # After one untimed call, as after a job's first shard: pyarrow's memory pool (mimalloc) grows
    # on first use, a one-time stall of up to 0.3 s on this machine, whatever the rows hold.
    logprob_columns(shard)
    columns = worst(stall(logprob_columns, shard) for _ in range(3))
    print(f"stall, logprob_columns of {args.shard} rows: {columns}")
    rows = args.rows, args.tokens, args.k
    named = worst(stall(det._name_tokens, batch(*rows, seed=2 + i)) for i in range(3))
    print(f"stall, naming {args.rows} rows: {named}")
    del shard
    watch = stream(det, args, shards=2)
    print(
        f"stream of 2 shards: stall {watch.worst * 1e3:.1f} ms, {watch.full_collections} full "
        f"collections, longest collection {watch.longest_gc * 1e3:.1f} ms, all collections "
        f"{watch.gc_total * 1e3:.0f} ms"
    )
    # What a gc.freeze() once everything is loaded would leave: the startup objects (torch,
    # transformers, the tokenizer) are never visited again.
    gc.collect()
    gc.freeze()
    shard = batch(args.shard, args.tokens, args.k, seed=1)
    det._name_tokens(shard)
    print(f"gc.collect, {args.shard} rows named, startup frozen: {collect_ms():.0f} ms")


def collect_ms() -> float:
    """A full collection's time, the best of 3."""
    return min(timed(lambda _: gc.collect(), []) for _ in range(3)) * 1e3


def timed(fn, rows: list[Row]) -> float:
    start = time.perf_counter()
    fn(rows)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
