"""silu_and_mul_fp8's split forms (fp8_fused.py): each row of gate_up in SPLIT_BLOCK-wide chunks,
a program per (row, chunk), in two launches: each chunk's absmax, then each chunk quantized with
its row's scale (the max of its chunks' maxima: the row's absmax exactly, so the same bits as the
one- and two-pass forms). One pass gives a row one program: 32 of the H200's 132 SMs at blog's
32 rows, where it took 9 us of a 4.8 ms FP8 step a layer (4489b1e's kernel profile); split, blog
FP8's decode steps ran 4.44 ms against 4.54 (02502f4).

"split" computes silu again in the second launch, from gate_up in L2. At large row counts the
kernels are bound by that arithmetic, not by memory (exact expf and IEEE divisions, to match
torch: 83.8 us a layer at 2,048 rows against 43.6 for the bf16 op, which computes it once).
"stash" has the first launch also store each silu(gate) * up value in gate_up's dtype (the value
is rounded to it already, so storing it is exact) and the second quantize from those: silu
computed once, for 2 bytes a value written and read once more (bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model import pdl
from bulkgen.model.fp8_kernels import hw_rounding, quantize_value, row_scale
from bulkgen.model.fused import silu_times_up
from bulkgen.model.pdl import pdl_launch_dependents

SPLIT_BLOCK = 2048  # values of a row per program


@triton.jit
def _silu_absmax_kernel(
    gate_up_ptr,
    absmax_ptr,
    stash_ptr,
    I,
    stride_row,
    BLOCK: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
    STASH: tl.constexpr,  # also store the values at stash_ptr ([rows, I], gate_up's dtype)
):
    """absmax[row, chunk]: the largest |silu(gate) * up| of one BLOCK-wide chunk of a row."""
    row, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    value = silu_times_up(gate_up_ptr + row * stride_row, cols, I, LIBDEVICE_EXP)
    if STASH:
        tl.store(stash_ptr + row * I + cols, value.to(stash_ptr.dtype.element_ty), mask=cols < I)
    tl.store(absmax_ptr + row * tl.num_programs(1) + chunk, tl.max(tl.abs(value), axis=0))


@triton.jit
def _silu_quantize_kernel(
    gate_up_ptr,
    absmax_ptr,
    stash_ptr,
    q_ptr,
    scale_ptr,
    I,
    stride_row,
    parts,  # absmax values a row (the first launch's chunks, or fp8_gemm_silu.py's N tiles)
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,  # a power of two >= parts
    LIBDEVICE_EXP: tl.constexpr,
    STASH: tl.constexpr,  # read the values _silu_absmax_kernel stored instead of recomputing
    PDL: tl.constexpr,
    HW_ROUND: tl.constexpr,  # fp8_kernels.HW_ROUNDING
):
    """One chunk of a row quantized by the row's scale, from the parts' absmax (the max of
    maxima: the row's absmax exactly, so the same scale and bits as one pass)."""
    if PDL:
        pdl_launch_dependents()
    row, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    part = tl.arange(0, CHUNKS)
    absmax = tl.load(absmax_ptr + row * parts + part, mask=part < parts, other=0.0)
    scale = row_scale(tl.max(absmax, axis=0))
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    if STASH:
        value = tl.load(stash_ptr + row * I + cols, mask=cols < I, other=0.0).to(tl.float32)
    else:
        value = silu_times_up(gate_up_ptr + row * stride_row, cols, I, LIBDEVICE_EXP)
    q = quantize_value(value, scale, HW_ROUND)
    tl.store(q_ptr + row * I + cols, q.to(q_ptr.dtype.element_ty), mask=cols < I)
    if chunk == 0:
        tl.store(scale_ptr + row, scale)


def silu_split(
    gate_up: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, stash: bool = False
) -> None:
    """silu(gate) * up of gate_up [T, 2I] into fp8 q [T, I] and its rows' scales [T, 1]: two
    launches of (rows, chunks) programs; stash: the values kept between them (the "stash"
    form), else computed in each."""
    T, I = gate_up.shape[0], gate_up.shape[1] // 2
    chunks = triton.cdiv(I, SPLIT_BLOCK)
    absmax = torch.empty((T, chunks), dtype=torch.float32, device=gate_up.device)
    kept = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device) if stash else absmax
    exp, stride = gate_up.is_cuda, gate_up.stride(0)
    _silu_absmax_kernel[(T, chunks)](
        gate_up, absmax, kept, I, stride, BLOCK=SPLIT_BLOCK, LIBDEVICE_EXP=exp, STASH=stash
    )
    _quantize(gate_up, absmax, kept, q, scale, stash)


def quantize_stashed(
    values: torch.Tensor, absmax: torch.Tensor, q: torch.Tensor, scale: torch.Tensor
):
    """values [T, I] (16-bit, exact) into fp8 q [T, I] and scales [T, 1] by the rows' absmax,
    the max of absmax [T, parts]: the stash form's second launch, for values and maxima another
    kernel wrote (fp8_gemm_silu.py)."""
    _quantize(values, absmax, values, q, scale, True)


def _quantize(gate_up, absmax, kept, q, scale, stash: bool) -> None:
    """The second launch: (rows, SPLIT_BLOCK chunks) programs quantizing kept values (stash) or
    silu(gate) * up of gate_up computed again."""
    T, I = q.shape
    chunks, parts = triton.cdiv(I, SPLIT_BLOCK), absmax.shape[1]
    _silu_quantize_kernel[(T, chunks)](
        gate_up,
        absmax,
        kept,
        q,
        scale,
        I,
        gate_up.stride(0),
        parts,
        BLOCK=SPLIT_BLOCK,
        CHUNKS=triton.next_power_of_2(parts),
        LIBDEVICE_EXP=gate_up.is_cuda,
        STASH=stash,
        PDL=pdl.enabled(gate_up.device),
        HW_ROUND=hw_rounding(gate_up.device),
    )
