"""The benchmark's kernel-gap report (scripts/bench_measure.py): busy time is the union of the
kernel intervals, and every idle stretch between them is counted once, with its neighbours."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_measure import gap_report, kernel_gaps  # noqa: E402


def test_overlapping_kernels_count_once_and_each_gap_names_its_neighbours():
    spans = [(0, 10, "a"), (5, 12, "b"), (15, 20, "c"), (120, 130, "d"), (130, 131, "e")]
    busy, gaps = kernel_gaps(spans)
    assert busy == 12 + 5 + 11
    assert gaps == [(3, "b", "c"), (100, "c", "d")]  # e starts as d ends: no gap


def test_a_kernel_inside_another_neither_ends_the_busy_stretch_nor_names_the_gap():
    busy, gaps = kernel_gaps([(0, 100, "graph"), (10, 20, "inner"), (150, 160, "next")])
    assert busy == 110 and gaps == [(50, "graph", "next")]


def test_the_report_sums_gaps_by_size_and_lists_the_largest_first():
    report = gap_report([(3, "b", "c"), (250, "sample", "replay"), (40, "x", "y")], 1000)
    lines = [line.strip() for line in report.splitlines()]
    assert lines[0] == "idle between kernels: 293 us of 1000 us"
    assert "gaps 0-5 us: 1, 3 us" in lines and "gaps 100-1000 us: 1, 250 us" in lines
    assert lines[-3:] == [
        "250 us after sample before replay",
        "40 us after x before y",
        "3 us after b before c",
    ]


def idle_gap(series) -> float:
    from bench_measure import Sampler

    sampler = Sampler.__new__(Sampler)  # the series only: no NVML here
    sampler.series = series
    return sampler.max_idle_gap_s


def test_nvml_lag_at_the_start_is_no_gap_while_tokens_flow():
    # 0cbf7c0's trt run: NVML read 0 for four samples while the first steps made tokens.
    start = [(0.71, 0, 0), (0.76, 0, 0), (0.81, 0, 2), (0.86, 0, 6), (0.91, 0, 12), (0.96, 0, 12)]
    running = [(1.01 + 0.05 * i, 100, 20 + 10 * i) for i in range(5)]
    assert idle_gap([*start, *running, (1.5, 100, 1000)]) == 0.0


def test_a_stall_mid_run_is_the_time_the_count_stood_still_with_the_gpu_idle():
    before = [(0.05 * i, 100, 10 * i) for i in range(1, 6)]  # tokens 10..50
    stall = [(0.30, 0, 50), (0.35, 0, 50), (0.40, 0, 50), (0.45, 0, 50)]  # a compile, say
    after = [(0.50, 100, 60), (0.55, 100, 70), (0.60, 100, 80)]
    assert idle_gap([*before, *stall, *after]) == 0.15
    assert idle_gap([*before, *stall[:1], *after]) == 0.0, "one sample: no stretch"


def test_busy_over_the_run_is_nvml_from_its_first_busy_sample_to_its_last():
    from bench_measure import Sampler

    sampler = Sampler.__new__(Sampler)
    start = [(0.05 * i, 0, 0) for i in range(1, 5)]  # the pipeline starting: no token yet
    lag = [(0.25, 0, 2), (0.30, 0, 6)]  # NVML still reads the idle period before the first step
    run = [(0.35, 100, 10), (0.40, 90, 20), (0.45, 0, 20), (0.50, 100, 30), (0.55, 100, 40)]
    tail = [(0.60, 100, 40), (0.65, 0, 40)]  # NVML trails the end too
    sampler.series = [*start, *lag, *run, *tail]
    assert sampler.busy_run == sum([100, 90, 0, 100, 100, 100]) / 6
    assert sampler.busy == sum(u for _, u, _ in sampler.series) / 13
    assert sampler.first_token_s == 0.25
    sampler.series = start
    assert sampler.busy_run is None and sampler.first_token_s is None
