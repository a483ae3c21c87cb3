"""Per-token FP8 activation quantization in one Triton launch: per-row absmax, scale, cast.

Computes fp8.quantize_rows_reference bit for bit: the absmax and the division run in float32
with IEEE rounding (div_rn; Triton's "/" is approximate on the GPU), then the clamp to +-448 and
round-to-nearest-even to an e4m3 value done in float32 arithmetic (_round_e4m3), so that the cast
itself is exact: the GPU's cvt rounds to nearest even too, but the interpreter's cast truncates,
and the tests run there. A program owns one row and reads it twice (absmax, then cast:
the second read hits L2), so any width runs without a row-sized register tile. The launch depends
on shapes only, and a static scale is read on the device, so CUDA graphs capture it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from bulkgen.model import pdl
from bulkgen.model.fp8 import FP8, FP8_MAX, MIN_ABSMAX
from bulkgen.model.pdl import pdl_launch_dependents
from bulkgen.model.switches import HW_ROUNDING_ENV, switch

BLOCK = 2048  # elements of a row per loop iteration (two passes)
# quantize_rows reads a row in one pass up to this many rows: on the H200 at o_proj's 4,096-wide
# input (scripts/bench_fp8_fused.py, 7fca268) one pass took 5.5/5.9/7.4 us at 32/128/256 rows
# against 6.6/7.7/8.3 for two; at 1 and 512 rows it was within 10% slower. Timed as a step runs
# it (32 calls in a CUDA graph, 783479e) one pass was the faster at every count, 1-1,024 rows:
# 2.3/2.4/2.7/3.7/5.0/7.3 us at 1/32/128/256/512/1,024 against 3.1/3.2/3.5/4.5/5.5/8.1.
ONE_PASS_MAX_ROWS = 1024
ONE_PASS_MAX_WIDTH = 16384
# quantize_value rounds to e4m3 in float32 arithmetic (_round_e4m3: about a dozen integer and
# float operations a value), which the interpreter needs, its cast truncating. Compiled for sm_90
# the cast itself is cvt.rn.satfinite.e4m3x2.f32 (scripts/fp8_compile_check.py), one instruction
# per two values rounding to nearest even: with HW_ROUNDING the kernels leave the rounding to it.
# The FP8 activation kernels are compute-bound at large row counts (the SiLU's split form 90.8 us
# a layer at 2,048 rows against 43.6 for the bf16 op, H200 at 406730b). On the H200 at c7331d4
# its GPU test (tests/test_fp8.py: every e4m3 value and midpoint, the SiLU forms and the RMSNorm
# against torch's bits) passed, and in graphs (bench_fp8_fused.py) the split SiLU took 83.8 us at
# 2,048 rows against 90.5, quantize_rows 8.5 against 10.9 (1-10% faster at 1-1,024 rows).
HW_ROUNDING = True
_FP8_MAX = tl.constexpr(FP8_MAX)
_MIN_ABSMAX = tl.constexpr(MIN_ABSMAX)


_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2**23: (y + _ROUND) - _ROUND rounds |y| < 2**22 to even


@triton.jit
def _round_e4m3(x):
    """x (float32, |x| <= 448) rounded to the nearest float8_e4m3fn value, ties to even."""
    # The spacing of e4m3 values around x: 2**(exponent - 3) for normals (3 mantissa bits),
    # 2**-9 below the smallest normal 2**-6. Scaling by powers of two is exact.
    bits = x.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    step = tl.maximum(exponent, -6) - 3
    spacing = ((127 + step) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - step) << 23).to(tl.float32, bitcast=True)  # exact: both powers of two
    rounded = ((tl.abs(x) * inverse + _ROUND) - _ROUND) * spacing
    # x's sign bit, so that values rounding to zero keep it (-0.0) as torch's cast does.
    return (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


def hw_rounding(device: torch.device) -> bool:
    """Whether the FP8 kernels launched on `device` leave the e4m3 rounding to the cast."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    on = switch(HW_ROUNDING_ENV, HW_ROUNDING)  # BULKGEN_FP8_HW_ROUNDING=1/0 for A/B runs
    return on and device.type == "cuda" and not interpreted


@triton.jit
def row_scale(absmax):
    """A row's scale from its absmax (float32): absmax / 448, an all-zero row's tiny."""
    return tl.math.div_rn(tl.maximum(absmax, _MIN_ABSMAX), _FP8_MAX)


@triton.jit
def quantize_value(x, scale, HW_ROUND: tl.constexpr):
    """x (float32) / scale as the float8_e4m3fn value torch's clamp-and-cast gives (once cast:
    HW_ROUND leaves the rounding to the cast, see HW_ROUNDING)."""
    clamped = tl.clamp(tl.math.div_rn(x, scale), -_FP8_MAX, _FP8_MAX)
    if HW_ROUND:
        return clamped
    return _round_e4m3(clamped)


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    static_scale_ptr,
    K,
    stride_x,
    BLOCK: tl.constexpr,
    STATIC: tl.constexpr,
    ONE_PASS: tl.constexpr,
    PDL: tl.constexpr,  # let a GEMM launched with PDL start now (pdl.py)
    HW_ROUND: tl.constexpr,  # HW_ROUNDING
):
    if PDL:
        pdl_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    if ONE_PASS:  # the whole row in one tile (BLOCK >= K): read once
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
        if STATIC:
            scale = tl.load(static_scale_ptr).to(tl.float32)
        else:
            scale = row_scale(tl.max(tl.abs(x), axis=0))  # 0 past K: no effect
        q = quantize_value(x, scale, HW_ROUND)
        tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=cols < K)
    else:  # BLOCK-wide runs: absmax, then quantize (the second read hits L2)
        if STATIC:
            scale = tl.load(static_scale_ptr).to(tl.float32)
        else:
            absmax = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, K, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
                absmax = tl.maximum(absmax, tl.abs(x))
            scale = row_scale(tl.max(absmax, axis=0))
        for start in range(0, K, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
            q = quantize_value(x, scale, HW_ROUND)
            tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=cols < K)
    tl.store(scale_ptr + row, scale)


def quantize_rows(
    x: torch.Tensor, static_scale: torch.Tensor | None = None, one_pass: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (rows contiguous) -> (fp8 [M, K], float32 scales [M, 1]); new tensors.

    one_pass: the whole row in one tile of up to ONE_PASS_MAX_WIDTH values, read once, instead
    of two passes over BLOCK-wide runs with 4 warps; the same bits either way. None takes
    one pass up to ONE_PASS_MAX_ROWS rows, where it measured faster (at blog's 32 rows each of the
    32 programs walks its row twice otherwise)."""
    assert x.dim() == 2 and x.stride(1) == 1, "quantize_rows needs [M, K] with contiguous rows"
    M, K = x.shape
    q = torch.empty((M, K), dtype=FP8, device=x.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    if M == 0:
        return q, scale
    one_pass = M <= ONE_PASS_MAX_ROWS if one_pass is None else one_pass
    one_pass = one_pass and K <= ONE_PASS_MAX_WIDTH
    block = triton.next_power_of_2(K) if one_pass else min(BLOCK, triton.next_power_of_2(K))
    _quantize_rows_kernel[(M,)](
        x,
        q,
        scale,
        scale if static_scale is None else static_scale,  # unread without a static scale
        K,
        x.stride(0),
        BLOCK=block,
        STATIC=static_scale is not None,
        ONE_PASS=one_pass,
        PDL=pdl.enabled(x.device),
        HW_ROUND=hw_rounding(x.device),
        num_warps=min(16, max(4, block // 512)) if one_pass else 4,
    )
    return q, scale
