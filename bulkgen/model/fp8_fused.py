"""RMSNorm and SiLU * up that write FP8 rows and their scales, for the projections they feed.

With FP8 projections, each norm or SiLU output would be written in bf16, read back by the
activation quantizer and written again in fp8: per decoder layer three more launches and, at 256
decode rows of the 8B shape, 23 MB more memory traffic (0.74 GB a step, beside 8 GB of
weights). These kernels end instead with the
quantizer's epilogue: the bf16 value the op would have written (rounded exactly as fused.py
rounds it) is scaled by its row's absmax / 448 and stored as float8_e4m3fn, with the row's scale.
So a projection fed by one of them computes what it would have from the bf16 tensor: bit for bit
the fused.py op followed by fp8_kernels.quantize_rows, but for the SiLU's default form,
rows_fast (fp8_silu_rows.py: approximate arithmetic, rare values one e4m3 step away).

fp8_ops() gives a layer's ops namespace with these in place of rms_norm, add_rms_norm and
silu_and_mul; fp8.fuse_input_quantization() hands it to the modules whose ops feed only FP8
projections. Like fused.py, the launches depend on shapes only (CUDA-graph safe).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from bulkgen.model import pdl
from bulkgen.model.fp8 import FP8, Fp8Activation
from bulkgen.model.fp8_gemm_silu import gate_up_silu
from bulkgen.model.fp8_kernels import hw_rounding, quantize_rows, quantize_value, row_scale
from bulkgen.model.fp8_silu_rows import ROWS_MAX_WIDTH, silu_rows
from bulkgen.model.fp8_silu_split import silu_split
from bulkgen.model.fused import NORM_TILE, residual_for, silu_and_mul, silu_times_up
from bulkgen.model.pdl import pdl_launch_dependents
from bulkgen.model.switches import SILU_FORM_ENV

SILU_BLOCK = 2048  # elements of a row per loop iteration (two passes)
# silu_and_mul_fp8 reads a row in one pass up to this many rows (its docstring): on the H200 at
# the 8B shape (scripts/bench_fp8_fused.py, 7fca268) one pass took 13.1/14.2/23.5 us at 32/128/256
# rows against two passes' 21.7/23.4/25.1, and lost at 512 and 1,024 (41.5 vs 34.2, 76.0 vs 63.8).
ONE_PASS_MAX_ROWS = 256
ONE_PASS_MAX_WIDTH = 16384  # 32 values a thread at 16 warps (the 8B shape's 14,336 fits)
SILU_FORMS = ("one_pass", "two_pass", "split", "staged", "stash")
# Forms whose values may differ from those (bit for bit the same) in rare e4m3 roundings.
FAST_SILU_FORMS = ("rows_fast",)
# The split forms up to this many rows: timed as a step runs it (bench_fp8_fused.py, 32 calls in
# a CUDA graph, H200, 783479e) split took 6.2/10.5/15.8/26.8/49.2 us at 32/128/256/512/1,024 rows
# against one pass's 9.8/10.5/19.3/36.6/71.3 and two passes' 18.6/18.9/21.2/29.5/58.7. At 135c9a6
# (same timing) stash took 4.0/5.3/6.1/8.1/11.5/19.5/37.0/70.3/137.6/273.5 us at 1/32/64/128/256/
# 512/1,024/2,048/4,096/8,192 rows against split's 4.6/6.1/7.2/10.0/14.8/25.0/45.9/84.4/164.8/
# 324.0 and staged's 6.3/7.8/8.5/9.9/13.7/24.0/46.8/87.4/168.8/328.4 (the bf16 op: 1.5 ... 23.0
# at 1,024, 171.3 at 8,192): stash at every count since, until rows_fast (fp8_silu_rows.py) took
# 3.3/4.0/4.7/7.0/11.9/19.3/21.4/39.1/74.4/144.4 us at 1/32/128/256/512/889/1,024/2,048/4,096/
# 8,192 rows against stash's 3.5/5.2/7.8/11.3/19.2/32.3/36.6/69.7/136.1/272.0 (cd80261, the
# same timing): rows_fast at every count where a row fits its registers, stash past that.
SPLIT_MAX_ROWS = 1 << 30


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_fp8_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    q_ptr,
    scale_ptr,
    new_res_ptr,
    n_rows,
    H,
    eps,
    stride_x,
    stride_res,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,  # let a GEMM launched with PDL start now (pdl.py)
    HW_ROUND: tl.constexpr,  # fp8_kernels.HW_ROUNDING
):
    if PDL:
        pdl_launch_dependents()
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < n_rows)[:, None] & (cols < H)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    out_offsets = rows[:, None] * H + cols[None, :]
    dtype = x_ptr.dtype.element_ty
    if HAS_RESIDUAL:  # as fused._rms_norm_kernel: the norm reads the rounded sum
        r = tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
        h = (x + r.to(tl.float32)).to(dtype)
        tl.store(new_res_ptr + out_offsets, h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    normed = (x * rstd[:, None]).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    out = (w[None, :] * normed).to(dtype).to(tl.float32)  # the value fused.rms_norm writes
    scale = row_scale(tl.max(tl.abs(out), axis=1))
    q = quantize_value(out, scale[:, None], HW_ROUND)
    tl.store(q_ptr + out_offsets, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=rows < n_rows)


@triton.jit
def _silu_and_mul_fp8_kernel(
    gate_up_ptr,
    q_ptr,
    scale_ptr,
    I,
    stride_row,
    BLOCK: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
    ONE_PASS: tl.constexpr,
    PDL: tl.constexpr,
    HW_ROUND: tl.constexpr,  # fp8_kernels.HW_ROUNDING
):
    if PDL:
        pdl_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    row_ptr = gate_up_ptr + row * stride_row
    if ONE_PASS:  # the whole row in one tile (BLOCK >= I): read once, silu computed once
        cols = tl.arange(0, BLOCK)
        value = silu_times_up(row_ptr, cols, I, LIBDEVICE_EXP)  # 0 past I: no effect on absmax
        scale = row_scale(tl.max(tl.abs(value), axis=0))
        q = quantize_value(value, scale, HW_ROUND)
        tl.store(q_ptr + row * I + cols, q.to(q_ptr.dtype.element_ty), mask=cols < I)
    else:  # two passes over BLOCK-wide runs (absmax, then quantize; the second reads L2)
        absmax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, I, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            absmax = tl.maximum(absmax, tl.abs(silu_times_up(row_ptr, cols, I, LIBDEVICE_EXP)))
        scale = row_scale(tl.max(absmax, axis=0))
        for start in range(0, I, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            q = quantize_value(silu_times_up(row_ptr, cols, I, LIBDEVICE_EXP), scale, HW_ROUND)
            tl.store(q_ptr + row * I + cols, q.to(q_ptr.dtype.element_ty), mask=cols < I)
    tl.store(scale_ptr + row, scale)


def _outputs(rows: int, width: int, device: torch.device) -> Fp8Activation:
    q = torch.empty((rows, width), dtype=FP8, device=device)
    return Fp8Activation(q, torch.empty((rows, 1), dtype=torch.float32, device=device))


def _norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    residual_out: torch.Tensor | None = None,
) -> tuple[Fp8Activation, torch.Tensor | None]:
    assert x.dim() == 2 and x.stride(1) == 1, "the FP8 norm takes [N, H] with contiguous rows"
    assert weight.dtype == x.dtype and weight.shape == (x.shape[1],) and weight.is_contiguous()
    n_rows, H = x.shape
    out = _outputs(n_rows, H, x.device)
    new_res = None
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(1) == 1
        new_res = residual_for(x, residual, residual_out)
    if n_rows == 0:
        return out, new_res
    block_h = triton.next_power_of_2(H)
    rows = max(1, NORM_TILE // block_h)
    _rms_norm_fp8_kernel[(triton.cdiv(n_rows, rows),)](
        x,
        x if residual is None else residual,  # unread without a residual
        weight,
        out.q,
        out.scale,
        x if new_res is None else new_res,  # unwritten without a residual
        n_rows,
        H,
        eps,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        BLOCK_H=block_h,
        ROWS=rows,
        HAS_RESIDUAL=residual is not None,
        PDL=pdl.enabled(x.device),
        HW_ROUND=hw_rounding(x.device),
        num_warps=min(16, max(1, block_h * rows // 512)),
    )
    return out, new_res


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> Fp8Activation:
    """fused.rms_norm of x [N, H], quantized per row for an FP8 projection."""
    return _norm(x, None, weight, eps)[0]


def add_rms_norm_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual_out: torch.Tensor | None = None,
) -> tuple[Fp8Activation, torch.Tensor]:
    """(rms_norm(x + residual) quantized per row, x + residual), in one pass; the sum in
    residual_out when given."""
    out, new_res = _norm(x, residual, weight, eps, residual_out)
    assert new_res is not None
    return out, new_res


def silu_and_mul_fp8(gate_up: torch.Tensor, form: str | None = None) -> Fp8Activation:
    """fused.silu_and_mul of gate_up [T, 2I], quantized per row for an FP8 projection.

    form (SILU_FORMS; the same values bit for bit in each): "one_pass", the whole row in one tile
    of up to ONE_PASS_MAX_WIDTH values (16 warps), read once; "two_pass", a program a row reading
    it twice in 2,048-wide runs (4 warps): it took 28.6 us at ~500 rows of the 8B shape on the
    H200 against 10.6 us for the bf16 silu_and_mul (ec92f71, a bulk run's kernel profile);
    "split", SPLIT_BLOCK-wide chunks of every row, a program each, in two launches; "stash", the
    split form with the values kept in gate_up's dtype between its launches (fp8_silu_split.py:
    silu computed once); "staged",
    fused.silu_and_mul's bf16 rows, then quantize_rows over them (one pass): silu computed once
    and the rows written and read once more, where the others compute it twice (exact expf and
    an IEEE division, to match torch: at 2,048 rows the two-pass form took 98 us a layer on the
    H200 against 42 for the bf16 op, a bulk mixed step's kernel profile at 9141486). Not bit for
    bit those: "rows_fast" (FAST_SILU_FORMS; fp8_silu_rows.py), a program a row holding it in
    registers (read once, silu once) with approximate silu and scaling, which puts rare values
    one e4m3 step away. None takes default_silu_form(T, I).
    """
    assert gate_up.dim() == 2 and gate_up.stride(1) == 1 and gate_up.shape[1] % 2 == 0
    T, I = gate_up.shape[0], gate_up.shape[1] // 2
    form = form or default_silu_form(T, I)
    if form not in SILU_FORMS + FAST_SILU_FORMS:
        choices = SILU_FORMS + FAST_SILU_FORMS
        raise ValueError(f"silu_and_mul_fp8 form must be one of {choices}, got {form!r}")
    if form == "staged":  # quantize_rows reads a row of up to ONE_PASS_MAX_WIDTH in one pass
        return Fp8Activation(*quantize_rows(silu_and_mul(gate_up), one_pass=True))
    out = _outputs(T, I, gate_up.device)
    if T == 0:
        return out
    if form in ("split", "stash"):
        silu_split(gate_up, out.q, out.scale, stash=form == "stash")
        return out
    if form == "rows_fast":
        silu_rows(gate_up, out.q, out.scale)
        return out
    one_pass = form == "one_pass" and I <= ONE_PASS_MAX_WIDTH
    block = triton.next_power_of_2(I) if one_pass else min(SILU_BLOCK, triton.next_power_of_2(I))
    _silu_and_mul_fp8_kernel[(T,)](
        gate_up,
        out.q,
        out.scale,
        I,
        gate_up.stride(0),
        BLOCK=block,
        LIBDEVICE_EXP=gate_up.is_cuda,
        ONE_PASS=one_pass,
        PDL=pdl.enabled(gate_up.device),
        HW_ROUND=hw_rounding(gate_up.device),
        num_warps=min(16, max(4, block // 1024)) if one_pass else 4,
    )
    return out


def default_silu_form(rows: int, width: int) -> str:
    """The form silu_and_mul_fp8 takes for rows x width: rows_fast where a row fits its registers
    (fp8_silu_rows.ROWS_MAX_WIDTH), else stash up to SPLIT_MAX_ROWS rows (every count since
    135c9a6), then two passes (one pass where ONE_PASS_MAX_ROWS allows, should the split forms'
    limit fall below it). BULKGEN_SILU_FORM (a form's name) overrides it: A/B runs of the
    benchmark, and stash for the bit-exact forms' values."""
    forced = os.environ.get(SILU_FORM_ENV)
    if forced:
        if forced not in SILU_FORMS + FAST_SILU_FORMS:
            choices = ", ".join(SILU_FORMS + FAST_SILU_FORMS)
            raise ValueError(f"{SILU_FORM_ENV} names a SiLU form, one of {choices}: {forced!r}")
        return forced
    if width <= ROWS_MAX_WIDTH:
        return "rows_fast"
    if rows <= SPLIT_MAX_ROWS:
        return "stash"
    return "one_pass" if rows <= ONE_PASS_MAX_ROWS and width <= ONE_PASS_MAX_WIDTH else "two_pass"


def fp8_ops(base: SimpleNamespace) -> SimpleNamespace:
    """base with its norms and SiLU writing FP8 rows (rotary as it is)."""
    return SimpleNamespace(
        rms_norm=rms_norm_fp8,
        add_rms_norm=add_rms_norm_fp8,
        silu_and_mul=silu_and_mul_fp8,
        gate_up_silu=gate_up_silu,  # both, fused into gate_up's GEMM where enabled (llama.MLP)
        rotary=base.rotary,
    )
