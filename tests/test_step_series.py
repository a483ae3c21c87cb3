"""engine/step_series.py: a stats series keeps bounded memory over any number of steps; its
counts, sums and maximum stay exact, its quantiles exact up to KEEP values and close past them;
and the engine's per-step series (host times, GPU gaps, mask time) are such series."""

from __future__ import annotations

import random

import pytest

from bulkgen.engine import step_series
from bulkgen.engine.host_times import HostTimes
from bulkgen.engine.monitor import step_time_stats
from bulkgen.engine.step_series import Series


def test_up_to_keep_values_every_value_is_kept_and_quantiles_are_exact():
    s = Series(over=0.5, keep=8)
    for value in [0.3, 0.9, 0.1, 0.7, 0.2]:
        s.append(value)
    assert list(s) == [0.3, 0.9, 0.1, 0.7, 0.2] and len(s) == 5 and s[1] == 0.9
    assert s.total == pytest.approx(2.2) and (s.max, s.max_index) == (0.9, 1)
    assert s.num_over == 2
    # the sorted values' int(q * n): 0.3 and 0.9
    assert step_time_stats(x=s) == {"x_ms_per_step_median": 300.0, "x_ms_per_step_p99": 900.0}


def test_past_keep_memory_is_bounded_and_the_figures_hold():
    rng = random.Random(1)
    values = [rng.expovariate(1.0) for _ in range(200_000)]
    values[123_456] = 50.0  # one slow step far past the kept ones
    s = Series(over=3.0, keep=4096)
    for v in values:
        s.append(v)
    assert len(s.values) == 4096 and len(s) == 200_000
    assert s.total == pytest.approx(sum(values)) and (s.max, s.max_index) == (50.0, 123_456)
    assert s.num_over == sum(v > 3.0 for v in values)
    ordered = sorted(values)
    stats = step_time_stats(x=s)
    for q, label in ((0.5, "median"), (0.99, "p99")):  # a uniform sample of 4,096: within a
        # percentile or so of the truth
        low, high = ordered[int((q - 0.015) * len(values))], ordered[int((q + 0.005) * len(values))]
        assert round(1e3 * low, 3) <= stats[f"x_ms_per_step_{label}"] <= round(1e3 * high, 3)
    # The sample is uniform over the whole run, not its start (exponential: mean 1.0).
    assert sum(s.values) / len(s.values) == pytest.approx(1.0, abs=0.06)
    late = Series(keep=4096)
    for v in range(200_000):
        late.append(float(v))
    assert sum(v >= 100_000 for v in late.values) == pytest.approx(2048, rel=0.1)


def test_the_same_values_give_the_same_sample():
    a, b = Series(keep=100), Series(keep=100)
    for v in range(10_000):
        a.append(float(v))
        b.append(float(v))
    assert list(a) == list(b)


def test_host_times_keep_bounded_series(monkeypatch):
    monkeypatch.setattr(step_series, "KEEP", 16)
    times = HostTimes()
    for step in range(1000):
        times.record(step % 10 != 0, (0.001, 0.002 + step * 1e-6, 0.001), 0.001)
    assert len(times.total) == 1000 and len(times.total.values) == 16
    assert len(times.kind["mixed"]) == 100 and len(times.kind["decode"]) == 900
    stats = times.stats
    assert stats["host_max_step"] == 999
    assert stats["host_ms_per_step_max"] == round(1e3 * (0.004 + 999e-6), 3)
