"""A process that builds one engine after another (a notebook, an eval looping over models) gets
the first one's memory back: its startup freeze does not keep it alive."""

from __future__ import annotations

import gc
import weakref

from bulkgen import LLM


def test_a_dropped_engine_in_a_reference_cycle_is_freed_when_the_next_one_starts(tiny_model_dir):
    first = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    assert gc.get_freeze_count() > 0, "the engine froze its startup objects"
    first.engine.itself = first.engine  # garbage that only a collection frees
    model = weakref.ref(first.engine.runner.model)
    del first
    gc.collect()
    assert model() is not None, "frozen: out of the collector's reach"
    second = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    assert model() is None, "the first engine's weights were released before the second loaded"
    assert second.engine.runner.model is not None
