"""Batch-invariant GEMM on the GPU: y = x @ w.T (+ bias) whose rows are the same bits in any batch.

cuBLAS picks kernels, tile shapes and split-K by the number of rows M, so a row's sum over K is
taken in an order that depends on its batch mates (their count, a CUDA-graph bucket's padding,
prefill or decode). In this Triton kernel the order depends on (N, K, dtype) only: the tiling
(MatmulConfig) comes from default_config(N, K, dtype), never from M, and there is no split-K:
each output tile is owned by one program that walks K from 0 upwards in BLOCK_K steps into one
float32 accumulator. Rows past M in the last row tile are masked off (read as zeros, never
stored), and M is not a specialised argument, so one binary serves every M. Element (i, j) is
then a function of x[i], w[j], the constant config and the row's position in its tile
(i % BLOCK_M); the tensor cores treat every position alike, which scripts/bench_invariant_mm.py
and the GPU test check by moving rows between positions. A config with tma=True runs the same
loop with its tiles fetched by the TMA (invariant_tma.py). invariant.py holds the CPU path and
the model-level switch.

The grid is a plain one, a program per output tile (GROUP_M swizzled for L2 reuse), not a
persistent one: with tiles fixed for every M, a decode step has fewer tiles than the H200 has SMs
(N / BLOCK_N of them), so a persistent loop would have nothing to loop over; for prefill, where
tiles are many, the swizzle already keeps the weight panel in L2, and the order in which tiles
run does not change any result.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class MatmulConfig:
    """One tiling of the kernel; any choice is invariant, the choice only sets the speed."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8  # row tiles that share a weight panel while it is in L2
    num_warps: int = 4
    num_stages: int = 3
    # Load tiles with the Hopper TMA (invariant_tma.py) rather than per-thread pointer loads,
    # for weights whose rows the TMA can read (16-byte aligned); others take the pointer kernel.
    tma: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "group_m"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"MatmulConfig.{name} must be a power of two, got {value}")
        if self.block_k < 16:
            raise ValueError(f"MatmulConfig.block_k must be >= 16 (tl.dot), got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"MatmulConfig.num_warps must be 1, 2, 4, 8 or 16: {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"MatmulConfig.num_stages must be >= 1, got {self.num_stages}")


# Candidate tilings for scripts/bench_invariant_mm.py (Hopper: wgmma wants block_m >= 64 and
# 4 or 8 warps). Shared memory per stage is (block_m + block_n) * block_k * 2 bytes in bf16.
CANDIDATES: dict[str, MatmulConfig] = {
    "m64n32k128": MatmulConfig(64, 32, 128, num_warps=4, num_stages=5),
    "m64n64k128": MatmulConfig(64, 64, 128, num_warps=4, num_stages=4),
    "m64n128k64": MatmulConfig(64, 128, 64, num_warps=4, num_stages=4),
    "m128n64k64": MatmulConfig(128, 64, 64, num_warps=4, num_stages=4),
    "m128n128k64": MatmulConfig(128, 128, 64, num_warps=8, num_stages=4),
    "m128n128k64w4": MatmulConfig(128, 128, 64, num_warps=4, num_stages=4),
    "m128n256k64": MatmulConfig(128, 256, 64, num_warps=8, num_stages=3),
    "m64n256k64": MatmulConfig(64, 256, 64, num_warps=4, num_stages=3),
    # TMA tiles keep block_k * 2 bytes at 128, the TMA's widest swizzled row.
    "m64n32k64t": MatmulConfig(64, 32, 64, num_warps=4, num_stages=8, tma=True),
    "m64n64k64t": MatmulConfig(64, 64, 64, num_warps=4, num_stages=6, tma=True),
    "m128n128k64t": MatmulConfig(128, 128, 64, num_warps=8, num_stages=4, tma=True),
    "m128n256k64t": MatmulConfig(128, 256, 64, num_warps=8, num_stages=3, tma=True),
}
# float32 runs without tensor cores ("ieee": torch's fp32 linear does not use TF32 either);
# its tiles are twice the bytes, so smaller ones.
FP32_CONFIG = MatmulConfig(64, 64, 32, num_warps=4, num_stages=3)
# The tiling for shapes the table does not list: the fastest on each of Llama-3-8B's five GEMM
# shapes on the H200 (0.74-0.87 of cuBLAS's speed, geometric mean over M = 512 and 2048).
FALLBACK = "m128n128k64t"


def default_config(n: int, k: int, dtype: torch.dtype) -> MatmulConfig:
    """The tiling for a weight [n, k] of this dtype, never a function of M: the tiling measured
    fastest for this (n, k, dtype) on the H200 (invariant_tilings.json, written by
    `scripts/bench_invariant_mm.py --write-table`).

    Else FALLBACK, measured fastest on every shape of the table.
    """
    if dtype == torch.float32:
        return FP32_CONFIG
    name = measured_tilings().get(str(dtype).removeprefix("torch."), {}).get(f"{n}x{k}")
    if name is not None:
        return CANDIDATES[name]
    return CANDIDATES[FALLBACK]


TILINGS_FILE = Path(__file__).with_name("invariant_tilings.json")


@functools.cache
def measured_tilings() -> dict[str, dict[str, str]]:
    """{dtype: {"NxK": candidate name}} from TILINGS_FILE (read once; {} without it)."""
    try:
        table = json.loads(TILINGS_FILE.read_text())
    except FileNotFoundError:
        return {}
    return {dtype: shapes for dtype, shapes in table.items() if isinstance(shapes, dict)}


@triton.jit
def tile_of(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program pid: GROUP_M row tiles sweep a band of column tiles
    together, so a weight panel is reused from L2. The order changes no result."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_size, (pid % per_group) // group_size


@triton.jit
def mma(acc, a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b in float32 (a [BM, BK], b [BK, BN])."""
    if UPCAST:  # the interpreter only (see invariant_matmul)
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def store_tile(acc, bias_ptr, y_ptr, rows, cols, M, N, stride_ym, HAS_BIAS: tl.constexpr):
    """acc (+ bias) rounded once to y's dtype; rows past M and columns past N are not stored."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


# M is not specialised (Triton would compile other variants for M == 1 and M % 16 == 0): every M
# runs the very same binary, and a CUDA graph's bucket size never triggers a compile.
@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m, pid_n = tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # Rows past M are masked off (no memory traffic: a decode step's one row tile reads its few
    # rows, not BLOCK_M); columns past N read valid columns again (modulo), unmasked, as Llama's
    # N is a multiple of every BLOCK_N. Neither is ever stored.
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows[:, None] < M
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :] * stride_xk
    w_ptrs = w_ptr + (cols % N).to(tl.int64)[None, :] * stride_wn + ks[:, None] * stride_wk

    # The invariant: one program, K in order from 0, one float32 accumulator, nothing split.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=row_ok, other=0.0)
            b = tl.load(w_ptrs)
        else:  # zeros past K add exact zeros to every sum
            a = tl.load(x_ptrs, mask=row_ok & (ks[None, :] < K - k * BLOCK_K), other=0.0)
            b = tl.load(w_ptrs, mask=ks[:, None] < K - k * BLOCK_K, other=0.0)
        acc = mma(acc, a, b, IEEE, UPCAST)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    store_tile(acc, bias_ptr, y_ptr, rows, cols, M, N, stride_ym, HAS_BIAS)


def invariant_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias [N]) -> [M, N] in x's dtype, by the Triton kernel.

    config: the tiling (default: default_config(N, K, dtype)); passing one is for benchmarks.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"invariant_matmul needs x [M, K] and weight [N, K]: {x.shape}, {weight.shape}"
        )
    if x.dtype != weight.dtype:
        raise ValueError(f"invariant_matmul: x is {x.dtype} but the weight is {weight.dtype}")
    (M, K), N = x.shape, weight.shape[0]
    cfg = config or default_config(N, K, x.dtype)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_() if bias is None else y.copy_(bias.expand(M, N))
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    flags = dict(
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        # CPU tensors mean TRITON_INTERPRET=1, whose tl.dot multiplies bfloat16's raw uint16 bits
        # as integers (Triton 3.9): there, bfloat16 operands are widened first (exactly).
        UPCAST=not x.is_cuda and x.dtype == torch.bfloat16,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    bias_arg = bias if bias is not None else weight  # unread without a bias
    if cfg.tma:
        from bulkgen.model.invariant_tma import launch_tma, tma_aligned

        if tma_aligned(weight):  # the same answer at every call with this weight
            launch_tma(grid, x, weight, bias_arg, y, flags)
            return y
    _matmul_kernel[grid](
        x,
        weight,
        bias_arg,
        y,
        M,
        N,
        K,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        y.stride(0),
        EVEN_K=K % cfg.block_k == 0,
        **flags,
    )
    return y
