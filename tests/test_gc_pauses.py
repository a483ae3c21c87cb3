"""gc_policy.GcPauses: Python's collections during a run, for stats.json (a collection holds
every thread, the engine's too: a gap between GPU steps that the host's step times miss)."""

from __future__ import annotations

import gc

from bulkgen.engine.gc_policy import GcPauses


def test_counts_the_collections_after_its_start_by_generation():
    gc.collect()  # before: not counted
    pauses = GcPauses()
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    stats = pauses.stats
    assert stats["gc_collections"][2] == 2
    assert stats["gc_collections"][0] >= 1
    assert stats["gc_pause_s"] > 0


def test_a_long_collection_sets_the_max_and_the_count_over_10ms():
    pauses = GcPauses()
    held = [[i] for i in range(1_500_000)]  # tracked objects a full collection walks
    try:
        gc.collect(2)
    finally:
        del held
    stats = pauses.stats
    assert stats["gc_pause_max_ms"] >= 10
    assert stats["gc_pauses_over_10ms"] >= 1
    assert stats["gc_pause_s"] * 1e3 >= stats["gc_pause_max_ms"]
    later = GcPauses()  # a new run does not inherit the earlier one's pauses
    assert later.stats["gc_pauses_over_10ms"] == 0 and later.stats["gc_pause_max_ms"] == 0


def test_a_dead_instances_hook_is_unhooked_and_others_callbacks_kept():
    def foreign(phase, info):
        pass

    gc.callbacks.append(foreign)
    try:
        pauses = GcPauses()
        hook = gc.callbacks[-1]
        assert hook.pauses() is pauses
        del pauses  # no cycle: freed at once, its hook left orphaned
        kept = GcPauses()  # unhooks the orphan, hooks its own
        assert hook not in gc.callbacks and foreign in gc.callbacks
        hooks = [cb for cb in gc.callbacks if hasattr(cb, "pauses")]
        assert all(cb.pauses() is not None for cb in hooks)
        assert hooks[-1].pauses() is kept
    finally:
        gc.callbacks.remove(foreign)
