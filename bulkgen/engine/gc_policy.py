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
    """Before an engine loads and sizes its KV cache: an earlier engine of this process that
    nothing references any more is garbage held in reference cycles, and its own
    freeze_startup_objects() put it out of the collector's reach. Unfrozen and collected here,
    its weights and cache go back to the device (a second 8B engine in one process otherwise
    found no memory left for its cache). The new engine freezes its own objects again."""
    gc.unfreeze()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
