"""A Triton FP8 GEMM for few rows: what Fp8Linear's torch._scaled_mm computes, tuned to stream
the weight at the bandwidth a decode step's GEMM is bound by.

    out[m, n] = bf16(sum_k xq[m, k] * wq[n, k] * x_scale[m] * w_scale[n])   (float32 sums)

At M <= 128 rows a projection reads its weight once and does little else, yet cuBLASLt's FP8
kernels reach 40-55% of the H200's copy bandwidth there (scripts/bench_fp8_mm.py). This kernel
gives each program a thin row tile (BLOCK_M 16) and a slice of the weight, and splits K over
SPLIT_K programs when N / BLOCK_N alone would leave SMs idle (N = 4096 at BLOCK_N 64 is 64
programs for 132 SMs): each split writes float32 partial sums and a second launch adds them,
applies the scales and rounds once to bf16. Nothing depends on data: the grid and the partial
buffer follow from the shapes, so CUDA graphs capture both launches. A fixup launch
(Fp8GemmConfig.fixup) needs no second one: each split counts itself in at its output tile (an
acquire-release atomic at GPU scope, after a barrier), and the last to arrive adds the partials
in split order, rounds, and zeroes the count for the next launch. A tma launch
(Fp8GemmConfig.tma) fetches its tiles with the Hopper TMA instead: fp8_gemm_tma.py.

The operands meet the tensor cores in one of two ways (Fp8GemmConfig.dot): "fp8" hands the e4m3
tiles to tl.dot as they are (wgmma on e4m3 on sm_90, but for a 16-row tile that is not swapped,
which Triton widens to fp16 itself), "fp16" widens them in registers first (exact: every e4m3
value is an fp16 value). swap_ab computes the transposed product, weight tile times rows, so the
weight's BLOCK_N rows fill the MMA's M side (Hopper's wgmma wants 64) and the few activation rows
its narrow N side. The Triton interpreter runs every variant (its tl.dot takes e4m3 too), which
is how the CPU tests check them.

Which kernel serves a projection at M rows is measured, not guessed: fp8_gemm_table.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model import pdl

# The launches (tiles, splits, operand handling) and the candidates the tuner times.
from bulkgen.model.fp8_gemm_configs import CANDIDATES, Fp8GemmConfig
from bulkgen.model.fp8_gemm_finish import finish_tile
from bulkgen.model.pdl import pdl_wait, prefetch_l2

__all__ = ["CANDIDATES", "Fp8GemmConfig", "fp8_gemm", "output_tiles", "tile_counters_for"]


# Hopper's fp8 MMA keeps fewer bits than float32 while it sums (about 14, DeepSeek-V3 measured);
# Triton's default on sm_90 lets the whole K run sum that way, as cuBLASLt's use_fast_accum does
# (FAST_ACCUM, from EngineConfig.fp8_fast_accum: on by default with FP8 weights since its H200
# measurements, README FP8 weights). Adding each 32-deep MMA's result into the float32
# accumulator instead sums as _scaled_mm does without fast accumulation.
_PRECISE_K = tl.constexpr(32)


@triton.jit
def _dot(acc, a, b, DOT: tl.constexpr, FAST_ACCUM: tl.constexpr):
    """acc + a @ b in float32 from fp8 tiles."""
    if DOT == "fp8":
        if FAST_ACCUM:
            return tl.dot(a, b, acc)
        else:
            return tl.dot(a, b, acc, max_num_imprecise_acc=_PRECISE_K)
    else:
        return tl.dot(a.to(tl.float16), b.to(tl.float16), acc)


@triton.jit
def k_tile(t, ks, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """K tile t's positions and which of them lie inside K (all where EVEN_K)."""
    k = t * BLOCK_K + ks
    if EVEN_K:
        return k, k >= 0
    else:  # zeros past K add exact zeros
        return k, k < K


@triton.jit
def tile_product(acc, x_rows, w_rows, k, row_ok, k_ok, SWAP_AB: tl.constexpr, DOT: tl.constexpr,
                 FAST_ACCUM: tl.constexpr):  # fmt: skip
    """acc plus one K tile's product: the rows at x_rows times the weight rows at w_rows, over
    the K positions k (acc [BLOCK_N, BLOCK_M] when SWAP_AB, else [BLOCK_M, BLOCK_N])."""
    if SWAP_AB:
        w = tl.load(w_rows[:, None] + k[None, :], mask=k_ok[None, :], other=0.0)
        x = tl.load(x_rows[None, :] + k[:, None], mask=row_ok[None, :] & k_ok[:, None], other=0.0)
        return _dot(acc, w, x, DOT, FAST_ACCUM)
    else:
        x = tl.load(x_rows[:, None] + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows[None, :] + k[:, None], mask=k_ok[:, None], other=0.0)
        return _dot(acc, x, w, DOT, FAST_ACCUM)


# M is not specialised: a CUDA-graph bucket's row count never compiles another variant.
@triton.jit(do_not_specialize=["M"])
def _fp8_gemm_kernel(
    x_ptr,
    w_ptr,
    x_scale_ptr,
    w_scale_ptr,
    out_ptr,
    part_ptr,  # float32 partial sums [SPLIT_K, M, N] (SPLIT_K > 1)
    count_ptr,  # int32 per output tile, zero between launches (FIXUP)
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    FIXUP: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
    PDL_TILES: tl.constexpr,  # > 0: launched with PDL (pdl.py), K tiles prefetched before the wait
    PDL_LINES: tl.constexpr,  # 128-byte lines of a weight row in a K tile (1 at least)
):
    # Row tiles vary fastest: the programs that share a weight slice run together, and those
    # after the first find it in L2 (a 28672-row weight is larger than the H200's L2).
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # Split pid_k owns a run of whole K tiles; the last runs may be shorter or empty.
    tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, tiles)
    # Rows past M are masked (never read); columns past N read valid rows again (modulo) and
    # are never stored, so the weight loads need no mask.
    row_ok = rows < M
    x_rows = x_ptr + rows.to(tl.int64) * stride_xm
    w_rows = w_ptr + (cols % N).to(tl.int64) * stride_wn
    if PDL_TILES > 0:  # before the wait the weight only, which no kernel writes (pdl.py)
        for t in tl.static_range(PDL_TILES):
            lines = (first + t) * BLOCK_K + tl.arange(0, PDL_LINES) * 128
            prefetch_l2(w_rows[:, None] + tl.minimum(lines, K - 1)[None, :])
        pdl_wait()
    if SWAP_AB:  # acc[n, m]: weight tile [BLOCK_N, BLOCK_K] @ rows [BLOCK_K, BLOCK_M]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:  # acc[m, n]: rows [BLOCK_M, BLOCK_K] @ weight tile [BLOCK_K, BLOCK_N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(first, last):
        k, k_ok = k_tile(t, ks, K, BLOCK_K, EVEN_K)
        acc = tile_product(acc, x_rows, w_rows, k, row_ok, k_ok, SWAP_AB, DOT, FAST_ACCUM)
    if SWAP_AB:
        acc = tl.trans(acc)
    finish_tile(acc, rows, cols, row_ok, M, N, stride_om, x_scale_ptr, w_scale_ptr, out_ptr,
                part_ptr, count_ptr, SPLIT_K, FIXUP)  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _reduce_splits_kernel(
    part_ptr, x_scale_ptr, w_scale_ptr, out_ptr, M, N, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr
):
    """out[m, n] = bf16(sum over splits of part[s, m, n] * x_scale[m] * w_scale[n])."""
    row, pid = tl.program_id(0), tl.program_id(1)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < N
    splits = tl.arange(0, SPLIT_K).to(tl.int64) * M * N
    parts = tl.load(
        part_ptr + splits[:, None] + row * N + cols[None, :], mask=col_ok[None, :], other=0.0
    )
    acc = tl.sum(parts, axis=0)
    w_scale = tl.load(w_scale_ptr + cols, mask=col_ok, other=0.0)
    out = acc * tl.load(x_scale_ptr + row) * w_scale
    tl.store(out_ptr + row.to(tl.int64) * N + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


REDUCE_BLOCK = 1024  # columns per program of the split-K reduction


def fp8_gemm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    config: Fp8GemmConfig,
    out_dtype: torch.dtype = torch.bfloat16,
    tile_counters: torch.Tensor | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """xq [M, K] fp8, x_scale [M, 1] float32, wq [N, K] fp8, w_scale [N] float32 -> [M, N] of
    out_dtype: (xq @ wq.T) * x_scale * w_scale with float32 sums, rounded once (fast_accum: the
    e4m3 MMAs sum the whole K in the tensor cores' narrower accumulator, as use_fast_accum).

    A fixup config with K split needs tile_counters: int32 zeros, at least output_tiles(M, N,
    config) of them, kept by the caller across calls (each launch leaves them zero again)."""
    if xq.dim() != 2 or wq.dim() != 2 or xq.shape[1] != wq.shape[1]:
        raise ValueError(f"fp8_gemm needs xq [M, K] and wq [N, K]: {xq.shape}, {wq.shape}")
    (M, K), N = xq.shape, wq.shape[0]
    out = torch.empty((M, N), dtype=out_dtype, device=xq.device)
    if M == 0 or N == 0:
        return out
    # The kernel's loads take K contiguous (rows may be strided); in the model they always are.
    xq = xq if xq.stride(1) == 1 else xq.contiguous()
    wq = wq if wq.stride(1) == 1 else wq.contiguous()
    x_scale, w_scale = x_scale.reshape(M).contiguous(), w_scale.reshape(N).contiguous()
    cfg = config
    split_k = effective_split_k(K, cfg)
    fixup = cfg.fixup and split_k > 1
    if fixup and (tile_counters is None or tile_counters.numel() < output_tiles(M, N, cfg)):
        raise ValueError(f"{cfg} at {M}x{N} needs {output_tiles(M, N, cfg)} tile counters")
    part = out if split_k == 1 else torch.empty((split_k, M, N), device=xq.device)
    kernel, x_arg, w_arg = _fp8_gemm_kernel, xq, wq
    if cfg.tma:  # the same launch, its tiles fetched by the TMA where it can read both operands
        from bulkgen.model.fp8_gemm_tma import tma_launch

        kernel, x_arg, w_arg = tma_launch(xq, wq, cfg) or (kernel, xq, wq)
    # Launched with PDL: may start before its input is written (the pointer kernel waits).
    early = pdl.enabled(xq.device) and kernel is _fp8_gemm_kernel
    grid = (triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n), split_k)
    kernel[grid](
        x_arg,
        w_arg,
        x_scale,
        w_scale,
        out,
        part,
        tile_counters if fixup else x_scale,  # a dummy pointer when unused
        M,
        N,
        K,
        xq.stride(0),
        wq.stride(0),
        N,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=split_k,
        SWAP_AB=cfg.swap_ab,
        DOT=cfg.dot,
        EVEN_K=K % cfg.block_k == 0,
        FIXUP=fixup,
        FAST_ACCUM=fast_accum and cfg.dot == "fp8",  # an fp16 MMA sums in float32 anyway
        PDL_TILES=pdl.PREFETCH_TILES if early else 0,
        PDL_LINES=max(1, cfg.block_k // 128),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **(pdl.launch_options(xq.device) if early else {}),
    )
    if split_k > 1 and not fixup:
        grid = (M, triton.cdiv(N, REDUCE_BLOCK))
        _reduce_splits_kernel[grid](
            part, x_scale, w_scale, out, M, N, SPLIT_K=split_k, BLOCK=REDUCE_BLOCK
        )
    return out


def effective_split_k(k: int, config: Fp8GemmConfig) -> int:
    """K splits of a launch: no more than K has tiles (rounded up to a power of two)."""
    return min(config.split_k, triton.next_power_of_2(triton.cdiv(k, config.block_k)))


def tile_counters_for(
    m: int, n: int, config: Fp8GemmConfig, device: torch.device
) -> torch.Tensor | None:
    """Zeroed tile counters for launches of config up to m rows (None where it needs none)."""
    return (
        torch.zeros(output_tiles(m, n, config), dtype=torch.int32, device=device)
        if config.fixup
        else None
    )


def output_tiles(m: int, n: int, config: Fp8GemmConfig) -> int:
    """Programs per K split: the tile counters a fixup launch at m rows uses."""
    return triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
