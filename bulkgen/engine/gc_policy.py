"""The engine and Python's garbage collector: what a run freezes out of the collector's reach,
how long the collections that remain pause it, and how an engine that is no longer referenced
gives its device memory back to the next one."""

from __future__ import annotations

import atexit
import collections
import gc
import time

import torch

# Every collection in the process since the first engine started (a callback in gc.callbacks,
# installed once): counts and seconds by generation, and the end time, generation and seconds of
# each one of LONG_S or more (a collection holds the interpreter: every thread waits, the engine
# thread included, and the GPU idles once its queued steps are done).
LONG_S = 0.001
_count = [0, 0, 0]
_seconds = [0.0, 0.0, 0.0]
_long: collections.deque[tuple[float, int, float]] = collections.deque(maxlen=100_000)
_began: list[float] = []


def _on_collection(phase: str, info: dict) -> None:
    now = time.perf_counter()
    if phase == "start":
        _began[:] = [now]
        return
    if not _began:
        return
    seconds, generation = now - _began.pop(), info["generation"]
    _count[generation] += 1
    _seconds[generation] += seconds
    if seconds >= LONG_S:
        _long.append((now, generation, seconds))


class GcPauses:
    """The collections from its creation on, for stats.json."""

    def __init__(self) -> None:
        if _on_collection not in gc.callbacks:
            gc.callbacks.append(_on_collection)
        self.start = time.perf_counter()
        self.count0, self.seconds0 = list(_count), list(_seconds)

    @property
    def stats(self) -> dict:
        """gc_collections: by generation (0, 1, 2); gc_pause_s: their seconds in all;
        gc_pause_max_ms: the longest; gc_pauses_over_10ms: how many took longer."""
        long = [seconds for end, _, seconds in _long if end >= self.start]
        return {
            "gc_collections": [now - then for now, then in zip(_count, self.count0, strict=True)],
            "gc_pause_s": round(sum(_seconds) - sum(self.seconds0), 6),
            "gc_pause_max_ms": round(max(long, default=0.0) * 1e3, 2),
            "gc_pauses_over_10ms": sum(seconds > 0.01 for seconds in long),
        }


def freeze_startup_objects() -> GcPauses:
    """Everything allocated so far (torch, transformers, the model's Python objects) lives for
    the whole run: moved out of the collector's generations, a full collection no longer walks it
    (without this, gen-2 collections paused the step loop 100-170 ms). Unfrozen at exit, so that
    native libraries' leak checks at shutdown see it freed. Returns the run's GcPauses (the
    collections after the freeze's own)."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    return GcPauses()


def release_dead_engines(device: torch.device) -> None:
    """Before an engine loads onto a GPU and sizes its KV cache: an earlier engine of this process
    that nothing references any more but that is held in reference cycles is garbage that
    freeze_startup_objects() put out of the collector's reach; collected here, its weights and
    cache go back to the device (a second 8B engine in one process otherwise found no memory
    left for its cache on the H200). Only on CUDA: there an engine's start takes seconds and its
    memory is the scarce one, while the collection costs about 0.2 s with torch and transformers
    loaded (hundreds of CPU engines in the test suite); CPU engines hold no cycles (tested)."""
    if device.type != "cuda":
        return
    collect_frozen_garbage()
    torch.cuda.empty_cache()


def collect_frozen_garbage() -> None:
    """Unfreeze what freeze_startup_objects() froze and collect it (the new engine freezes its
    own objects again at the end of its start)."""
    gc.unfreeze()
    gc.collect()
