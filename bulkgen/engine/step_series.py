"""Per-step (or per-sample) figures for stats.json in bounded memory.

A stats series used to keep every step's value: host_times.py's seven a step, gpu_gaps.py's two,
the GPU monitor's sample every 50 ms. A bulk job of millions of rows runs millions of steps, and
an LLM object in a user's process (an RL loop calling generate for days) never drops them, so
that memory grew without end (56 bytes a step in host_times alone). A Series counts, sums and
keeps the largest value and its index exactly, and keeps the values themselves up to KEEP, then
a uniform sample of KEEP of all of them (reservoir sampling, seeded: the same values give the
same sample), from which medians and percentiles are read (monitor.step_time_stats): exact up
to KEEP values, an estimate past them (the p99 of a 65,536-value sample is within about 0.1
percentile of the true one).
"""

from __future__ import annotations

import array
import random

KEEP = 1 << 16  # 512 KB of values a series


class Series:
    def __init__(self, over: float | None = None, keep: int | None = None) -> None:
        self.values = array.array("d")  # every value, or past keep a uniform sample of them
        self.keep = KEEP if keep is None else keep
        self.count = 0
        self.total = 0.0
        self.max: float | None = None
        self.max_index = -1  # the largest value's index from 0, the first where tied
        self.over = over  # values above this are counted (num_over)
        self.num_over = 0
        self._rng = random.Random(0)

    def append(self, value: float) -> None:
        """(The value is kept before it is counted: a reader on another thread, the GPU
        monitor's, never sees a count whose values are not there yet.)"""
        index = self.count
        if len(self.values) < self.keep:
            self.values.append(value)
        else:  # Algorithm R: the new value replaces a kept one with probability keep / count
            slot = self._rng.randrange(index + 1)
            if slot < self.keep:
                self.values[slot] = value
        self.total += value
        if self.max is None or value > self.max:
            self.max, self.max_index = value, index
        if self.over is not None and value > self.over:
            self.num_over += 1
        self.count = index + 1

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self.values)

    def __getitem__(self, index: int) -> float:
        return self.values[index]
