"""stats.json's allocator counters: growth of the CUDA caching allocator's counters from the end
of the engine's start (memory_stats() stands in for a GPU's here)."""

from __future__ import annotations

import torch

from bulkgen.engine.alloc_counts import AllocatorCounts


def test_counters_grow_from_the_engines_start(monkeypatch):
    counters = {"num_alloc_retries": 2, "num_sync_all_streams": 2, "num_device_alloc": 40}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: dict(counters))
    counts = AllocatorCounts(torch.device("cuda", 0))
    assert counts.stats == {
        "alloc_retries": 0,
        "alloc_syncs": 0,
        "device_mallocs": 0,
        "device_frees": None,  # a counter this torch does not keep
    }
    counters.update(num_alloc_retries=5, num_sync_all_streams=3, num_device_alloc=47)
    assert counts.stats == {
        "alloc_retries": 3,
        "alloc_syncs": 1,
        "device_mallocs": 7,
        "device_frees": None,
    }


def test_nothing_is_kept_on_the_cpu():
    assert set(AllocatorCounts(torch.device("cpu")).stats.values()) == {None}
