"""Which FP8 GEMM serves a projection at M rows: cuBLASLt (torch._scaled_mm) or a launch of the
Triton kernel in fp8_gemm.py, whichever scripts/tune_fp8_mm.py --write-table measured faster on
the GPU (issue 13). fp8_gemm_table.json holds its choices:

    {"device": "NVIDIA H200", "shapes": {"4096x4096": [{"max_m": 64, "kernel": "m16n64k128s4t"},
                                                      {"max_m": 512, "kernel": "scaled_mm"}]}}

Shapes are the weight's "NxK"; each shape's buckets rise in max_m, and M rows take the first
bucket with max_m >= M, that is the choice measured at the next measured M up. A shape or an M
the table does not cover takes _scaled_mm, as every FP8 projection did before any measurement.
The choice is a function of shapes only, made on the host: a CUDA graph's bucket size is fixed,
so each captured graph replays the one kernel chosen for its rows.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

from bulkgen.model.fp8_gemm import CANDIDATES, Fp8GemmConfig, fp8_gemm, output_tiles
from bulkgen.model.switches import table_file

SCALED_MM = "scaled_mm"  # the table's name for torch._scaled_mm
TABLE_FILE = Path(__file__).with_name("fp8_gemm_table.json")
# Another table read instead of TABLE_FILE, for A/B runs of two tables in one call (a missing
# file is an error, not "no table"); stats.json's env_overrides names it (switches.KERNEL_SWITCHES).
TABLE_ENV = "BULKGEN_FP8_GEMM_TABLE"


def table_path() -> Path:
    """The table the dispatch reads: BULKGEN_FP8_GEMM_TABLE's file where set, else TABLE_FILE."""
    return table_file(TABLE_ENV, TABLE_FILE)


@functools.cache
def measured_choices() -> dict[str, list[dict]]:
    """{"NxK": [{"max_m": int, "kernel": name}, ...]} from table_path() (read once; {} when
    TABLE_FILE is missing)."""
    path = table_path()
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    shapes = table.get("shapes", {})
    for shape, buckets in shapes.items():
        for bucket in buckets:
            if bucket["kernel"] != SCALED_MM and bucket["kernel"] not in CANDIDATES:
                raise ValueError(
                    f"{path} names kernel {bucket['kernel']!r} for {shape}, which "
                    "fp8_gemm.CANDIDATES lacks: rerun scripts/tune_fp8_mm.py --write-table"
                )
    return shapes


UNFUSED = "unfused"  # the table's "silu" name for: gate_up's GEMM and the SiLU run apart


@functools.cache
def measured_silu() -> dict[str, list[dict]]:
    """{"NxK": [{"max_m": int, "kernel": name or UNFUSED}, ...]}: the launches of gate_up's GEMM
    with the SiLU in its epilogue (fp8_gemm_silu.py) that scripts/bench_silu_gemm.py --tune
    measured fastest, from the table's "silu" ({} without)."""
    try:
        silu = json.loads(table_path().read_text()).get("silu", {})
    except FileNotFoundError:
        return {}
    for shape, buckets in silu.items():
        for bucket in buckets:
            config = CANDIDATES.get(bucket["kernel"])
            if bucket["kernel"] != UNFUSED and (config is None or config.split_k > 1 or config.tma):
                raise ValueError(
                    f"{table_path()} names {bucket['kernel']!r} for {shape}'s fused SiLU, not a "
                    "pointer launch without K splits: rerun scripts/bench_silu_gemm.py --tune"
                )
    return silu


@functools.cache
def gemm_choice(n: int, k: int, m: int) -> Fp8GemmConfig | None:
    """The Triton launch measured fastest for a weight [n, k] at m rows, or None: _scaled_mm."""
    for bucket in measured_choices().get(f"{n}x{k}", []):
        if m <= bucket["max_m"]:
            name = bucket["kernel"]
            return None if name == SCALED_MM else CANDIDATES[name]
    return None


def _triton_runs_on(device: torch.device) -> bool:
    """Triton kernels run on CUDA, and on the CPU under the interpreter (the tests)."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def tile_counters_needed(n: int, k: int) -> int:
    """The most tile counters a fixup launch the table chose for a weight [n, k] uses (at the
    largest rows of its bucket); 0 when it chose none."""
    needed = 0
    for bucket in measured_choices().get(f"{n}x{k}", []):
        config = CANDIDATES.get(bucket["kernel"])
        if config is not None and config.fixup:
            needed = max(needed, output_tiles(bucket["max_m"], n, config))
    return needed


def fp8_matmul(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    tile_counters: torch.Tensor | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """(xq [M, K] @ wq [N, K].T) * x_scale [M, 1] * w_scale [N] -> bf16 [M, N], by the kernel the
    table chose for (N, K, M). K and N must be multiples of 16 (cuBLASLt's FP8 GEMM wants it).
    tile_counters: the weight's own (tile_counters_needed of them, zeros), for fixup launches.
    fast_accum: let the tensor cores sum all of K in their own accumulator (both kernels; the
    table's "fast_accum" says which way it was timed)."""
    (m, k), n = xq.shape, wq.shape[0]
    config = gemm_choice(n, k, m) if _triton_runs_on(xq.device) else None
    if config is not None:
        return fp8_gemm(
            xq, x_scale, wq, w_scale, config, tile_counters=tile_counters, fast_accum=fast_accum
        )
    return torch._scaled_mm(
        xq,
        wq.t(),  # column-major [K, N], as cuBLASLt's FP8 GEMM requires
        scale_a=x_scale,
        scale_b=w_scale.view(1, -1),
        out_dtype=torch.bfloat16,  # rowwise scaling writes bf16 only
        use_fast_accum=fast_accum,
    )


def table_from_timings(timings: dict[str, dict[int, dict[str, float]]]) -> dict[str, list]:
    """{"NxK": {M: {kernel: seconds}}} -> the table's "shapes": the fastest kernel at each
    measured M, neighbouring Ms with the same winner merged into one bucket."""
    return {shape: buckets_from_winners(by_m) for shape, by_m in fastest(timings).items()}


def fastest(timings: dict[str, dict[int, dict[str, float]]]) -> dict[str, dict[int, str]]:
    """{"NxK": {M: {kernel: seconds}}} -> {"NxK": {M: the fastest kernel}}."""
    return {s: {m: min(us, key=us.get) for m, us in by_m.items()} for s, by_m in timings.items()}


def buckets_from_winners(winners: dict[int, str]) -> list[dict]:
    """{M: kernel} -> a shape's buckets, neighbouring Ms with the same kernel in one."""
    buckets: list[dict] = []
    for m in sorted(winners):
        if buckets and buckets[-1]["kernel"] == winners[m]:
            buckets[-1]["max_m"] = m
        else:
            buckets.append({"max_m": m, "kernel": winners[m]})
    return buckets


def merged_shapes(old: dict[str, list[dict]], new: dict[str, dict[int, str]]) -> dict[str, list]:
    """A table's "shapes" with `new`'s winners ({"NxK": {M: kernel}}, the Ms a tuner run
    measured) in place of `old`'s choices at those Ms, and old's everywhere else: old's buckets
    are read back at their own max_m and at each new M, so a run over some Ms of some shapes
    replaces only those."""
    shapes = {}
    for shape in sorted(old.keys() | new.keys()):
        buckets, fresh = old.get(shape, []), new.get(shape, {})
        winners = {}
        for m in {b["max_m"] for b in buckets} | set(fresh):
            pick = next((b["kernel"] for b in buckets if m <= b["max_m"]), None)
            if pick is not None:
                winners[m] = pick
        shapes[shape] = buckets_from_winners(winners | fresh)
    return shapes
