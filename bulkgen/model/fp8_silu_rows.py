"""silu_and_mul_fp8's "rows" forms (fp8_fused.py): a program a row, the whole row read once and
held in registers as gate_up's dtype (each value is rounded to it already, so that is exact) until
its absmax is known, then quantized and stored: HBM reads 2I and writes I bytes a row, against
the stash form's 2I + 2I read and 2I + I written (fp8_silu_split.py; at 8,192 rows of the 8B
shape 1.06 GB a layer against 0.59).

"rows" computes what the other forms do, bit for bit (libdevice's expf, IEEE divisions).
"rows_fast" uses the GPU's approximate exp2 and divisions for silu and multiplies by the row's
reciprocal scale instead of dividing by the scale: about a third of the instructions a value.
Its silu can differ from torch's float32 result in the last bits, which the rounding to the
row's dtype hides but for values within a few float32 ulps of a rounding boundary, and x * (1 /
scale) can differ from x / scale by an ulp, which the e4m3 rounding hides but at its midpoints:
so a few values in a million land one e4m3 step from the other forms' (tests/test_fp8_silu_rows.py
on the GPU says how many). Under the interpreter both are exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model import pdl
from bulkgen.model.fp8_kernels import _round_e4m3, hw_rounding, quantize_value, row_scale
from bulkgen.model.fused import silu_mul
from bulkgen.model.pdl import pdl_launch_dependents

_LOG2E = tl.constexpr(1.4426950408889634)
_FP8_MAX = tl.constexpr(448.0)
# Warps a row's program runs: 16,384 values (the 8B shape's 14,336 padded) are 32 a thread.
ROWS_WARPS = 16


@triton.jit
def _silu_rows_kernel(
    gate_up_ptr,
    q_ptr,
    scale_ptr,
    I,
    stride_row,
    BLOCK: tl.constexpr,  # a power of two >= I
    FAST: tl.constexpr,  # approximate silu and the reciprocal scale (rows_fast)
    LIBDEVICE_EXP: tl.constexpr,
    PDL: tl.constexpr,
    HW_ROUND: tl.constexpr,  # fp8_kernels.HW_ROUNDING
):
    if PDL:
        pdl_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < I
    row_ptr = gate_up_ptr + row * stride_row
    dtype = gate_up_ptr.dtype.element_ty
    gate = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row_ptr + I + cols, mask=mask, other=0.0).to(tl.float32)
    if FAST:
        act = (gate / (1.0 + tl.exp2(gate * -_LOG2E))).to(dtype).to(tl.float32)
        value = (act * up).to(dtype)
    else:
        value = silu_mul(gate, up, dtype, LIBDEVICE_EXP).to(dtype)  # 0 past I: no effect on absmax
    scale = row_scale(tl.max(tl.abs(value.to(tl.float32)), axis=0))
    if FAST:
        q = tl.clamp(value.to(tl.float32) * (1.0 / scale), -_FP8_MAX, _FP8_MAX)
        if not HW_ROUND:  # the interpreter's cast truncates (fp8_kernels.HW_ROUNDING)
            q = _round_e4m3(q)
    else:
        q = quantize_value(value.to(tl.float32), scale, HW_ROUND)
    tl.store(q_ptr + row * I + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def silu_rows(gate_up: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, fast: bool) -> None:
    """silu(gate) * up of gate_up [T, 2I] into fp8 q [T, I] and its rows' scales [T, 1], a
    program a row (fast: the rows_fast form)."""
    T, I = q.shape
    _silu_rows_kernel[(T,)](
        gate_up,
        q,
        scale,
        I,
        gate_up.stride(0),
        BLOCK=triton.next_power_of_2(I),
        FAST=fast,
        LIBDEVICE_EXP=gate_up.is_cuda,
        PDL=pdl.enabled(gate_up.device),
        HW_ROUND=hw_rounding(gate_up.device),
        num_warps=ROWS_WARPS,
    )
