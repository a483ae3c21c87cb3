"""engine/monitor.py's figures from its NVML samples (set by hand here: no NVML on the CPU)."""

from __future__ import annotations

from bulkgen.engine.monitor import GpuMonitor


def monitor(samples: list[int]) -> GpuMonitor:
    m = GpuMonitor.__new__(GpuMonitor)  # no device: the samples and counters only
    m.copy_bandwidth, m.decode_s, m.decode_bytes, m._samples = 4e12, 0.0, 0.0, samples
    return m


def test_busy_over_the_run_starts_at_nvmls_first_busy_sample():
    stats = monitor([0, 0, 0, 100, 100, 0, 100, 0]).stats  # lag, run with one idle, end
    assert stats["gpu_busy_pct"] == round(300 / 8, 1)
    assert stats["gpu_busy_run_pct"] == round(300 / 4, 1)


def test_no_busy_sample_gives_no_run_figure():
    stats = monitor([0, 0]).stats
    assert stats["gpu_busy_pct"] == 0.0 and "gpu_busy_run_pct" not in stats
