"""The engine and Python's garbage collector: what a run freezes out of the collector's reach,
and how an engine that is no longer referenced gives its device memory back to the next one."""

from __future__ import annotations

import atexit
import gc

import torch


def freeze_startup_objects() -> None:
    """Everything allocated so far (torch, transformers, the model's Python objects) lives for
    the whole run: moved out of the collector's generations, a full collection no longer walks it
    (without this, gen-2 collections paused the step loop 100-170 ms). Unfrozen at exit, so that
    native libraries' leak checks at shutdown see it freed."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


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
