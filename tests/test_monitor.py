"""engine/monitor.py's figures from its NVML samples (set by hand here: no NVML on the CPU)."""

from __future__ import annotations

import sys
import threading
import types

from bulkgen.engine.monitor import GpuMonitor


def monitor(samples: list[int], clocks: list | None = None) -> GpuMonitor:
    m = GpuMonitor.__new__(GpuMonitor)  # no device: the samples and counters only
    m.copy_bandwidth, m.decode_s, m.decode_bytes = 4e12, 0.0, 0.0
    m._max_clock, m._failed = None, set()
    m._start_counts()
    for util, with_it in zip(samples, clocks or [(None, None, None)] * len(samples), strict=True):
        m._add(util, *with_it)
    return m


def test_busy_over_the_run_starts_at_nvmls_first_busy_sample():
    stats = monitor([0, 0, 0, 100, 100, 0, 100, 0]).stats  # lag, run with one idle, end
    assert stats["gpu_busy_pct"] == round(300 / 8, 1)
    assert stats["gpu_busy_run_pct"] == round(300 / 4, 1)
    stats = monitor([0, 40, 0, 0, 90, 0, 0]).stats  # partly busy samples count as busy
    assert stats["gpu_busy_run_pct"] == round(130 / 4, 1)


def test_a_run_of_hours_keeps_bounded_samples_and_counts_every_one():
    """200,000 samples (2.8 hours at 20 a second): the clock and power series keep at most
    step_series.KEEP values; the counts, the busy share and the limits' shares are exact."""
    from bulkgen.engine.step_series import KEEP

    n = 200_000
    clocks = [(1500 + 10 * (i % 3), 690.0, 0x4 if i % 4 == 0 else 0) for i in range(n)]
    m = monitor([0] + [100] * n + [0], [(None, None, None)] + clocks + [(None, None, None)])
    assert len(m._clock_mhz.values) == KEEP == len(m._power_w.values) and m._clock_mhz.count == n
    stats = m.stats
    assert stats["gpu_busy_run_pct"] == 100.0
    assert stats["gpu_busy_pct"] == round(100 * n / (n + 2), 1)
    assert stats["gpu_sm_clock_mhz_median"] == 1510 and stats["gpu_power_w_median"] == 690.0
    assert stats["gpu_power_capped_pct"] == 25.0 and stats["gpu_thermal_pct"] == 0.0


def test_no_busy_sample_gives_no_run_figure():
    stats = monitor([0, 0]).stats
    assert stats["gpu_busy_pct"] == 0.0 and "gpu_busy_run_pct" not in stats


def test_clock_power_and_limits_count_the_busy_samples_only():
    clocks = [(1980, 90.0, 0), (1500, 690.0, 0x4), (1600, 700.0, 0x4 | 0x1), (1700, 650.0, 0x40)]
    m = monitor([0, 100, 100, 100], clocks)  # the idle sample's full clock is left out
    m._max_clock = 1980
    stats = m.stats
    assert stats["gpu_sm_clock_mhz_median"] == 1600 and stats["gpu_sm_clock_mhz_max"] == 1980
    assert stats["gpu_power_w_median"] == 690.0
    assert stats["gpu_power_capped_pct"] == round(200 / 3, 1)
    assert stats["gpu_thermal_pct"] == round(100 / 3, 1)


def test_nothing_nvml_cannot_say_is_reported():
    stats = monitor([100, 100]).stats
    assert "gpu_sm_clock_mhz_median" not in stats and "gpu_power_w_median" not in stats
    assert "gpu_power_capped_pct" not in stats


def test_the_sampler_asks_nvml_and_stops_asking_what_failed(monkeypatch):
    calls = {"reasons": 0}

    def reasons(handle):
        calls["reasons"] += 1
        raise RuntimeError("not supported")  # an older driver

    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980,
        nvmlDeviceGetClockInfo=lambda h, kind: 1755 if kind == 1 else 0,
        nvmlDeviceGetPowerUsage=lambda h: 612_500,
        nvmlDeviceGetCurrentClocksEventReasons=reasons,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = monitor([])
    m._nvml_handle, m._stop = object(), threading.Event()
    waits = iter([False, False, True])  # three samples, then stopped
    m._stop.wait = lambda timeout: next(waits)
    m._sample()
    assert (m._num_samples, m._util_sum, m._reason_samples) == (3, 291, 0)
    assert list(m._clock_mhz) == [1755] * 3 and list(m._power_w) == [612.5] * 3
    assert calls["reasons"] == 1
    stats = m.stats
    assert stats["gpu_sm_clock_mhz_median"] == 1755 and stats["gpu_sm_clock_mhz_max"] == 1980
    assert stats["gpu_power_w_median"] == 612.5 and "gpu_power_capped_pct" not in stats


def test_an_older_nvml_binding_gives_the_reasons_as_throttle_reasons(monkeypatch):
    fake = types.SimpleNamespace(  # no nvmlDeviceGetCurrentClocksEventReasons at all
        NVML_CLOCK_SM=1,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=100),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980,
        nvmlDeviceGetClockInfo=lambda h, kind: 1500,
        nvmlDeviceGetPowerUsage=lambda h: 700_000,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = monitor([])
    m._nvml_handle, m._stop = object(), threading.Event()
    m._stop.wait = lambda timeout: True  # one sample
    m._sample()
    assert m.stats["gpu_power_capped_pct"] == 100.0 and m.stats["gpu_power_w_median"] == 700.0
