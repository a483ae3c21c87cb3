"""gate_up's FP8 GEMM with silu(gate) * up in its epilogue, for the few rows a decode step of
blog's kind runs (on unless BULKGEN_FP8_SILU_GEMM=0; on the H200 at 881429d blog FP8 ran 1.1%
faster with it, README's FP8 weights section).

The MLP's FP8 path runs gate_up (fp8_gemm.py or cuBLASLt, bf16 [T, 2I] out), then the SiLU's
stash form (fp8_silu_split.py): a launch computing silu(gate) * up, its 16-bit values and each
chunk's absmax, and a launch quantizing them by their row's scale. Here each GEMM program loads
the gate rows and the up rows of its BLOCK_N columns (the weight bytes of a 2 * BLOCK_N tile),
rounds both products to bf16 as the GEMM's own output would be rounded, and writes what the
stash form's first launch writes: silu(gate) * up in bf16 and the tile's absmax per row. The
stash form's second launch then quantizes them (fp8_silu_split.quantize_stashed). So a layer
runs one launch fewer and never writes or reads gate_up's [T, 2I] output, and down's input holds
the same e4m3 values and scales as with the unfused ops given the same gate/up products
(tests/test_fp8_gemm_silu.py, under the interpreter).

Which launch: the one the table (fp8_gemm_table.py) chose for gate_up at these rows, through
pointer loads (a tma launch's tiles), its N tile halved from 128 up (each program then reads the
same weight bytes per K step as that launch); none where the table chose cuBLASLt or a K split,
and then the unfused ops run.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from bulkgen.model.fp8 import FP8, Fp8Activation, Fp8Linear
from bulkgen.model.fp8_gemm import Fp8GemmConfig, k_tile, tile_product
from bulkgen.model.fused import silu_mul
from bulkgen.model.switches import SILU_GEMM_ENV, switch


@triton.jit(do_not_specialize=["M"])
def _gate_up_silu_kernel(
    x_ptr,  # fp8 [M, K]
    w_ptr,  # fp8 [2I, K]: gate rows, then up rows
    x_scale_ptr,  # float32 [M]
    w_scale_ptr,  # float32 [2I]
    h_ptr,  # 16-bit [M, I]: silu(gate) * up
    absmax_ptr,  # float32 [M, cdiv(I, BLOCK_N)]: each row's largest |h| of the program's tile
    M,
    I,
    K,
    stride_xm,
    stride_wn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < I
    x_rows = x_ptr + rows.to(tl.int64) * stride_xm
    # Columns past I read valid rows again (modulo) and are never stored, as in fp8_gemm.py.
    gate_rows = w_ptr + (cols % I).to(tl.int64) * stride_wn
    up_rows = gate_rows + I.to(tl.int64) * stride_wn
    if SWAP_AB:
        gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros_like(gate)
    for t in range(0, tl.cdiv(K, BLOCK_K)):
        k, k_ok = k_tile(t, ks, K, BLOCK_K, EVEN_K)
        gate = tile_product(gate, x_rows, gate_rows, k, row_ok, k_ok, SWAP_AB, DOT, FAST_ACCUM)
        up = tile_product(up, x_rows, up_rows, k, row_ok, k_ok, SWAP_AB, DOT, FAST_ACCUM)
    if SWAP_AB:
        gate, up = tl.trans(gate), tl.trans(up)
    # Scaled and rounded to bf16 as fp8_gemm_finish.store_scaled rounds the GEMM's own output
    # (Fp8Linear then casts it to the model's dtype, exactly); silu_mul rounds to the model's.
    dtype = h_ptr.dtype.element_ty
    x_scale = tl.load(x_scale_ptr + rows, mask=row_ok, other=0.0)[:, None]
    gate_scale = tl.load(w_scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
    up_scale = tl.load(w_scale_ptr + I + cols, mask=col_ok, other=0.0)[None, :]
    gate = (gate * x_scale * gate_scale).to(tl.bfloat16).to(tl.float32)
    up = (up * x_scale * up_scale).to(tl.bfloat16).to(tl.float32)
    h = tl.where(col_ok[None, :], silu_mul(gate, up, dtype, LIBDEVICE_EXP), 0.0)
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * I + cols[None, :], h.to(dtype), mask=mask)
    absmax = tl.max(tl.abs(h), axis=1)
    tl.store(absmax_ptr + rows.to(tl.int64) * tl.num_programs(1) + pid_n, absmax, mask=row_ok)


def enabled() -> bool:
    """Unless BULKGEN_FP8_SILU_GEMM=0 (switches.apply_switches checks its value at model load)."""
    return switch(SILU_GEMM_ENV, True)


def fused_config(n: int, k: int, m: int) -> Fp8GemmConfig | None:
    """The launch gate_up_silu takes for a gate_up weight [n, k] at m rows: as the table's
    "silu" measured (scripts/bench_silu_gemm.py --tune) where it has the shape, else from the
    table's choice for the unfused GEMM (module docstring); None: no fused launch there."""
    from bulkgen.model.fp8_gemm_table import CANDIDATES, gemm_choice, measured_silu

    tuned = measured_silu().get(f"{n}x{k}")
    if tuned is not None:  # UNFUSED, or past the measured rows: None
        return CANDIDATES.get(next((b["kernel"] for b in tuned if m <= b["max_m"]), ""))
    config = gemm_choice(n, k, m)
    if config is None or config.split_k > 1 or config.dot != "fp8":
        return None
    return fused_launch(config)


def fused_launch(config: Fp8GemmConfig) -> Fp8GemmConfig:
    """The fused launch of gate_up's unfused one: through pointers, its N tile halved from 128
    up (each program then reads the same weight bytes per K step: gate and up rows)."""
    block_n = config.block_n // 2 if config.block_n >= 128 else config.block_n
    return dataclasses.replace(config, block_n=block_n, tma=False, fixup=False)


def gate_up_silu_rows(
    x: Fp8Activation, weight: torch.Tensor, w_scale: torch.Tensor, config: Fp8GemmConfig,
    fast_accum: bool = False, out_dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(silu(gate) * up [M, I] in out_dtype, each program's absmax [M, tiles]) of rows x and a
    gate_up weight [2I, K] with per-row scales: one launch of _gate_up_silu_kernel."""
    (M, K), I = x.q.shape, weight.shape[0] // 2
    tiles = triton.cdiv(I, config.block_n)
    h = torch.empty((M, I), dtype=out_dtype, device=x.q.device)
    absmax = torch.empty((M, tiles), dtype=torch.float32, device=x.q.device)
    if M == 0:
        return h, absmax
    _gate_up_silu_kernel[(triton.cdiv(M, config.block_m), tiles)](
        x.q,
        weight,
        x.scale.reshape(M).contiguous(),
        w_scale,
        h,
        absmax,
        M,
        I,
        K,
        x.q.stride(0),
        weight.stride(0),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        SWAP_AB=config.swap_ab,
        DOT=config.dot,
        EVEN_K=K % config.block_k == 0,
        FAST_ACCUM=fast_accum,
        LIBDEVICE_EXP=x.q.is_cuda,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return h, absmax


def gate_up_silu(linear: torch.nn.Module, x) -> Fp8Activation:
    """silu_and_mul_fp8(linear(x)), fused into linear's GEMM where enabled() and fused_config
    give a launch (an Fp8Linear with dynamic scales, no bias, its input rows already in FP8),
    else those two ops as they are."""
    from bulkgen.model.fp8_fused import silu_and_mul_fp8

    config = None
    if enabled() and isinstance(linear, Fp8Linear) and isinstance(x, Fp8Activation):
        if linear.bias is None and linear.use_scaled_mm and x.q.dim() == 2:
            config = fused_config(linear.out_features, linear.in_features, x.q.shape[0])
    if config is None:
        return silu_and_mul_fp8(linear(x))
    args = (linear.weight, linear.weight_scale, config, linear.fast_accum, linear.out_dtype)
    return fused_rows(x, *args)


def fused_rows(
    x: Fp8Activation, weight: torch.Tensor, w_scale: torch.Tensor, config: Fp8GemmConfig,
    fast_accum: bool = False, out_dtype: torch.dtype = torch.bfloat16,
) -> Fp8Activation:  # fmt: skip
    """down's FP8 input rows from gate_up's: gate_up_silu_rows, then the stash form's quantizer
    (fp8_silu_split.quantize_stashed) over its values and maxima."""
    from bulkgen.model.fp8_silu_split import quantize_stashed

    h, absmax = gate_up_silu_rows(x, weight, w_scale, config, fast_accum, out_dtype)
    out = Fp8Activation(
        torch.empty(h.shape, dtype=FP8, device=h.device),
        torch.empty((h.shape[0], 1), dtype=torch.float32, device=h.device),
    )
    if h.shape[0]:
        quantize_stashed(h, absmax, out.q, out.scale)
    return out
