"""The engine and Python's garbage collector: what a run freezes out of the collector's reach,
how long the collections that remain pause it, and how an engine that is no longer referenced
gives its device memory back to the next one."""

from __future__ import annotations

import atexit
import contextlib
import gc
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LONG_S = 0.01  # a collection longer than this is counted apart (gc_pauses_over_10ms)


class GcPauses:
    """Python's collections from its creation on, for stats.json: counts by generation, seconds,
    the longest. A collection holds the interpreter: every thread waits, the engine thread
    included, and the GPU idles once its queued steps are done. Each instance hooks its own
    callback into gc.callbacks through a weak reference; a hook whose instance is gone is
    unhooked when the next instance is made (never during a collection, which walks the list)."""

    def __init__(self) -> None:
        gc.callbacks[:] = [cb for cb in gc.callbacks if not _orphaned(cb)]
        self.count = [0, 0, 0]
        self.seconds = 0.0
        self.longest = 0.0
        self.long = 0
        self._began: float | None = None
        ref = weakref.ref(self)

        def hook(phase: str, info: dict) -> None:
            if (pauses := ref()) is not None:
                pauses._record(phase, info["generation"])

        hook.pauses = ref  # type: ignore[attr-defined]
        gc.callbacks.append(hook)

    def _record(self, phase: str, generation: int) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
            return
        if self._began is None:  # made during a collection: its end is not one of ours
            return
        seconds, self._began = now - self._began, None
        self.count[generation] += 1
        self.seconds += seconds
        self.longest = max(self.longest, seconds)
        self.long += seconds > LONG_S

    @property
    def stats(self) -> dict:
        """gc_collections: by generation (0, 1, 2); gc_pause_s: their seconds in all;
        gc_pause_max_ms: the longest; gc_pauses_over_10ms: how many took longer."""
        return {
            "gc_collections": list(self.count),
            "gc_pause_s": round(self.seconds, 6),
            "gc_pause_max_ms": round(self.longest * 1e3, 2),
            "gc_pauses_over_10ms": self.long,
        }


def _orphaned(callback) -> bool:
    """A GcPauses hook whose instance is gone (other libraries' callbacks are never)."""
    ref = getattr(callback, "pauses", None)
    return ref is not None and ref() is None


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


@contextlib.contextmanager
def survivors_frozen() -> Iterator[None]:
    """While a pipeline run generates: whatever survives a collection of the older generations
    (1 or 2) is frozen as soon as that collection ends, so that no later full collection walks
    it. A run's long-lived objects are its rows and requests, each holding its prompt's token
    ids in a list the collector visits item by item: on the H200 a `trt` run of 1,000 requests
    had full collections of 50-58 ms (7711cc6), each a pause of every thread and a gap between
    two steps on the GPU. Frozen objects are still freed when their last reference goes; only
    garbage held in reference cycles stays until the collector unfreezes (at exit, or before
    the next engine of the process loads on a GPU: release_dead_engines), and a run makes
    almost none (a CPU run of 600 requests: 81 objects found by collections in all, none of
    them by those of generations 1 and 2). The hook is removed when the block ends."""

    def freeze(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()  # the collection is over; its survivors are in the oldest generation

    gc.callbacks.append(freeze)
    try:
        yield
    finally:
        gc.callbacks.remove(freeze)


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
    import torch

    collect_frozen_garbage()
    torch.cuda.empty_cache()


def collect_frozen_garbage() -> None:
    """Unfreeze what freeze_startup_objects() froze and collect it (the new engine freezes its
    own objects again at the end of its start)."""
    gc.unfreeze()
    gc.collect()
