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
