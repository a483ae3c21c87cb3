"""silu_and_mul_fp8's "rows_fast" form (fp8_fused.py), the default: a program a row, the whole row
read once and held in registers as gate_up's dtype (each value is rounded to it already) until
its absmax is known, then quantized and stored. HBM reads 2I and writes I bytes a row, against
the stash form's 2I + 2I read and 2I + I written (fp8_silu_split.py; at 8,192 rows of the 8B
shape 0.59 against 1.06 GB a layer).

It is not bit for bit the other forms: silu runs on the GPU's approximate exp2 and division, and
the values are multiplied by the row's reciprocal scale rather than divided by the scale. Its
silu can differ from torch's float32 result in the last bits, which the rounding to the row's
dtype hides but near a rounding boundary, and x * (1 / scale) can differ from x / scale by an
ulp, which the e4m3 rounding hides but at its midpoints. On the H200 (cd80261, 8B width,
scripts/bench_fp8_fused.py --forms) 0.02-0.06% of the values landed one e4m3 step from the stash
form's at 32-8,192 rows (never more than one; 0.55% of a single row's), every row's scale the
same, for 19.3 us against 32.3 at 889 rows and 144.4 against 272.0 at 8,192. The exact
arithmetic in this layout (libdevice's expf, IEEE divisions) needed 128 registers a thread at 16
warps, one CTA an SM, and ran 503 us at 8,192 rows: not kept. Under the interpreter the
arithmetic is exact and so are the bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model import pdl
from bulkgen.model.fp8_kernels import _round_e4m3, hw_rounding, row_scale
from bulkgen.model.pdl import pdl_launch_dependents

_LOG2E = tl.constexpr(1.4426950408889634)
_FP8_MAX = tl.constexpr(448.0)
# Warps a row's program runs: 16,384 values (the 8B shape's 14,336 padded) are 32 a thread, in
# 64 registers (two CTAs an SM; scripts/kernel_resources.py's ptxas for sm_90a).
ROWS_WARPS = 16
# The widest row held in registers; wider rows take the stash form (fp8_fused.default_silu_form).
ROWS_MAX_WIDTH = 16384


@triton.jit
def _silu_rows_kernel(
    gate_up_ptr,
    q_ptr,
    scale_ptr,
    I,
    stride_row,
    BLOCK: tl.constexpr,  # a power of two >= I
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
    act = (gate / (1.0 + tl.exp2(gate * -_LOG2E))).to(dtype).to(tl.float32)
    value = (act * up).to(dtype)  # 0 past I: no effect on the absmax
    scale = row_scale(tl.max(tl.abs(value.to(tl.float32)), axis=0))
    q = tl.clamp(value.to(tl.float32) * (1.0 / scale), -_FP8_MAX, _FP8_MAX)
    if not HW_ROUND:  # the interpreter's cast truncates (fp8_kernels.HW_ROUNDING)
        q = _round_e4m3(q)
    tl.store(q_ptr + row * I + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def silu_rows(gate_up: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """silu(gate) * up of gate_up [T, 2I] (I <= ROWS_MAX_WIDTH) into fp8 q [T, I] and its rows'
    scales [T, 1], a program a row."""
    T, I = q.shape
    assert I <= ROWS_MAX_WIDTH, f"rows_fast holds rows of up to {ROWS_MAX_WIDTH} values, not {I}"
    _silu_rows_kernel[(T,)](
        gate_up,
        q,
        scale,
        I,
        gate_up.stride(0),
        BLOCK=triton.next_power_of_2(I),
        PDL=pdl.enabled(gate_up.device),
        HW_ROUND=hw_rounding(gate_up.device),
        num_warps=ROWS_WARPS,
    )
