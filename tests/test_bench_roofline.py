"""The benchmark's rooflines (scripts/bench_workloads.py): roofline_compute_s counts the decode
GEMMs' FLOPs as well as the bytes roofline_s counts, and differs from it only when they are the
longer of the two; and which settings of a --max-num-seqs sweep run (scripts/bench_bulkgen.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_workloads import (  # noqa: E402
    LLAMA3_8B,
    roofline_compute_s,
    roofline_s,
    weight_bytes_read,
)

BANDWIDTH, FLOPS = 4.24e12, 772e12  # the H200's measured copy bandwidth and bf16 matmul rate


def work(rows: int, prompt: int, out: int) -> list[tuple[list[int], int]]:
    return [([1] * prompt, out) for _ in range(rows)]


def test_a_weight_bound_decode_keeps_the_byte_roofline():
    blog = work(32, 256, 2048)  # 32 rows a step: the GEMMs read weights far longer than they add
    assert roofline_compute_s(blog, BANDWIDTH, FLOPS, 32) == roofline_s(blog, BANDWIDTH, FLOPS, 32)


def test_a_compute_bound_decode_adds_the_gemm_time_beyond_the_weight_reads():
    rows, out = 1024, 512
    bulk = work(rows, 100, out)
    params = weight_bytes_read(LLAMA3_8B) / 2
    gemm_s = 2 * params * rows * out / FLOPS
    weights_s = out * weight_bytes_read(LLAMA3_8B) / BANDWIDTH  # one read a step, 512 steps
    assert gemm_s > weights_s  # 1,024 rows a step: compute-bound
    extra = roofline_compute_s(bulk, BANDWIDTH, FLOPS, rows) - roofline_s(
        bulk, BANDWIDTH, FLOPS, rows
    )
    assert extra == pytest.approx(gemm_s - weights_s)


def test_fp8_weights_and_cache_halve_a_compute_bound_run():
    """FP8 tensor cores at twice the bf16 rate, one byte a KV element: every term of a
    compute-bound run halves (the weight reads, which would not quite, are not its bound)."""
    bulk = work(1024, 100, 512)
    bf16 = roofline_compute_s(bulk, BANDWIDTH, FLOPS, 1024)
    fp8 = roofline_compute_s(bulk, BANDWIDTH, FLOPS, 1024, fp8_weights=True, kv_fp8=True)
    assert fp8 == pytest.approx(bf16 / 2)


def test_a_sweep_runs_one_setting_of_those_that_admit_every_request():
    from bench_bulkgen import distinct_settings

    sweep = ["128", "256", "512", "1024", "auto"]
    assert distinct_settings(sweep, 400) == ["128", "256", "512", "auto"]
    assert distinct_settings(sweep, 3000) == sweep
    assert distinct_settings(sweep, 100) == ["128", "auto"]
    assert distinct_settings(["1024", "512"], 400) == ["1024"]  # the first given one runs
