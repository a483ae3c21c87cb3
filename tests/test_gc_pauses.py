"""gc_policy.GcPauses: Python's collections during a run, for stats.json (a collection holds
every thread, the engine's too: a gap between GPU steps that the host's step times miss)."""

from __future__ import annotations

import gc

from bulkgen.engine.gc_policy import GcPauses


def test_counts_the_collections_after_its_start_by_generation():
    gc.collect()  # before: not counted
    pauses = GcPauses()
    before = pauses.stats["gc_collections"]
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    after = pauses.stats
    assert after["gc_collections"][2] - before[2] == 2
    assert after["gc_collections"][0] - before[0] >= 1
    assert after["gc_pause_s"] > 0


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
