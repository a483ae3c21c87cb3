"""A process that builds one engine after another (a notebook, an eval looping over models) gets
the first one's memory back: its startup freeze does not keep it alive."""

from __future__ import annotations

import gc
import weakref

from bulkgen import LLM
from bulkgen.engine.gc_policy import collect_frozen_garbage


def test_a_dropped_cpu_engine_is_freed_at_once(tiny_model_dir):
    first = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    assert gc.get_freeze_count() > 0, "the engine froze its startup objects"
    model = weakref.ref(first.engine.runner.model)
    del first
    assert model() is None, "no reference cycle holds a CPU engine"


def test_a_frozen_engine_in_a_reference_cycle_is_collected_for_the_next_one(tiny_model_dir):
    first = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    first.engine.itself = first.engine  # garbage that only a collection frees
    model = weakref.ref(first.engine.runner.model)
    del first
    gc.collect()
    assert model() is not None, "frozen: out of the collector's reach"
    collect_frozen_garbage()  # what a CUDA engine's start does first (release_dead_engines)
    assert model() is None
