"""Would blog's FP8 GEMMs lose their fixed cost if the head of each program's weight stream were
already in L2? An experiment for issue 13's blog 1.5x (README, FP8 weights: at 32 rows each
FP8 GEMM takes 5-7 us more than its bytes at 4.0 TB/s, whatever its size).

In one CUDA graph per setting, 32 layers back to back, each on its own weights (L2 cannot keep a
layer's from one replay to the next): a stand-in for the small kernel before each GEMM (an add on
a [rows, 4096] bf16 tensor, about an RMSNorm's time at 32 rows), then the GEMM through the launch
the table chose (fp8_gemm_table.fp8_matmul, fast accumulation). With prefetch, a kernel launched
before the stand-in asks L2 for the first `tiles` K tiles of every GEMM program's weight rows
(prefetch.global.L2, pdl.prefetch_l2: nothing waited for, the kernel ends at once), so those
bytes stream in while the stand-in runs. Settings: none; launch (the prefetch kernel asking for
nothing: its launch's own cost); tiles 1, 2, 4. Projections: each alone (32 layers of it) and
`layer` (qkv, o, gate_up, down in a step's order, a stand-in before each).

    PYTHONPATH=.:scripts python scripts/bench_l2_prefetch.py [--rows 32]
    PYTHONPATH=. python scripts/bench_l2_prefetch.py --compile-check   # sm_90 PTX, no GPU

One JSON line per (projection, setting): microseconds per layer (median of 20 replays) and the
bytes each layer prefetches. If tiles beat none by more than launch costs, the prefetch belongs
in the kernels before the GEMMs (RMSNorm, quantize_rows, SiLU), not in a launch of its own.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from bulkgen.model.fp8_gemm import effective_split_k
from bulkgen.model.fp8_gemm_configs import Fp8GemmConfig
from bulkgen.model.pdl import prefetch_l2

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
LAYERS = 32
SETTINGS = ("none", "launch", 1, 2, 4)


@triton.jit
def _prefetch_heads(
    w_ptr,
    stride_wn,
    N,
    K,
    per_split,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TILES: tl.constexpr,
    LINES: tl.constexpr,
):
    """Program (n tile, K split) asks L2 for the first TILES K tiles that the GEMM program of
    the same coordinates reads first: BLOCK_N weight rows, LINES 128-byte lines a tile."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    first = pid_k * per_split
    for t in tl.static_range(TILES):
        cols = tl.minimum((first + t) * BLOCK_K + tl.arange(0, LINES) * 128, K - 1)
        prefetch_l2(w_ptr + rows[:, None] * stride_wn + cols[None, :])


def prefetch_plan(n: int, k: int, config: Fp8GemmConfig, tiles: int) -> dict:
    """The prefetch launch for a GEMM launch of config on a weight [n, k]: its grid, the K tiles
    per split, the lines per tile, and the bytes it asks for."""
    split = effective_split_k(k, config)
    per_split = triton.cdiv(triton.cdiv(k, config.block_k), split)
    lines = max(1, config.block_k // 128)
    tiles = min(tiles, per_split)
    grid = (triton.cdiv(n, config.block_n), split)
    return {
        "grid": grid,
        "per_split": per_split,
        "lines": lines,
        "tiles": tiles,
        "bytes": n * split * tiles * lines * 128,
    }


def prefetch(wq: torch.Tensor, config: Fp8GemmConfig, tiles: int) -> None:
    n, k = wq.shape
    plan = prefetch_plan(n, k, config, tiles)
    _prefetch_heads[plan["grid"]](
        wq, wq.stride(0), n, k, plan["per_split"],
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, TILES=plan["tiles"], LINES=plan["lines"],
    )  # fmt: skip


def compile_check() -> str:
    """The prefetch kernel compiled for sm_90 (no GPU; not under TRITON_INTERPRET): one line of
    its L2 prefetches and global loads in the PTX, at qkv's launch with 2 tiles."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"w_ptr": "*fp8e4nv", "stride_wn": "i32", "N": "i32", "K": "i32",
                 "per_split": "i32", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                 "TILES": "constexpr", "LINES": "constexpr"}  # fmt: skip
    constexprs = {"BLOCK_N": 64, "BLOCK_K": 256, "TILES": 2, "LINES": 2}
    src = ASTSource(_prefetch_heads, signature, constexprs=constexprs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    return f"{ptx.count('prefetch.global.L2')} L2 prefetches, {ptx.count('ld.global')} global loads"


def main() -> None:
    from bench_attention import steps_us
    from bench_commit import git_commit

    from bulkgen.model.fp8 import quantize_rows_reference, quantize_weight
    from bulkgen.model.fp8_gemm_table import fp8_matmul, gemm_choice, tile_counters_needed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--compile-check", action="store_true", help="sm_90 PTX only, no GPU")
    args = parser.parse_args()
    if args.compile_check:
        print(compile_check())
        return
    dev = torch.device("cuda")
    rows = args.rows
    weights = {}  # projection -> LAYERS of (xq, x_scale, wq, w_scale, counters, config)
    for name, (n, k) in SHAPES.items():
        config = gemm_choice(n, k, rows)
        if config is None:
            print(json.dumps({"projection": name, "rows": rows, "skipped": "scaled_mm"}))
            continue
        xq, x_scale = quantize_rows_reference(torch.randn(rows, k, device=dev))
        layer = []
        for _ in range(LAYERS):
            wq, w_scale = quantize_weight(torch.randn(n, k, device=dev) / k**0.5)
            counters = torch.zeros(max(1, tile_counters_needed(n, k)), dtype=torch.int32,
                                   device=dev)  # fmt: skip
            layer.append((xq, x_scale, wq, w_scale, counters, config))
        weights[name] = layer
    stand_in = torch.zeros(rows, 4096, dtype=torch.bfloat16, device=dev)

    def call(parts, setting):
        def run():
            for xq, x_scale, wq, w_scale, counters, config in parts:
                if setting != "none":
                    prefetch(wq, config, 0 if setting == "launch" else setting)
                stand_in.add_(1.0)
                fp8_matmul(xq, x_scale, wq, w_scale, counters, fast_accum=True)

        return run

    groups = {name: [[p] for p in layer] for name, layer in weights.items()}
    if len(weights) == len(SHAPES):
        groups["layer"] = [[weights[name][i] for name in SHAPES] for i in range(LAYERS)]
    commit = git_commit()
    for name, layers in groups.items():
        for setting in SETTINGS:
            us = steps_us([call(parts, setting) for parts in layers])
            tiles = 0 if setting in ("none", "launch") else setting
            asked = sum(prefetch_plan(*p[2].shape, p[5], tiles)["bytes"] for p in layers[0])
            print(json.dumps({
                "projection": name, "rows": rows, "setting": setting, "us_per_layer": round(us, 2),
                "prefetched_mb": round(asked / 1e6, 2), "git_commit": commit,
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
