"""Fused elementwise kernels of a decoder layer: RMSNorm (with the residual add), SiLU * up.

A decode step of a small batch spends much of its time in launches of tiny torch kernels (RMSNorm
alone is seven). Each op here is one Triton launch, a grid over rows, that reads its inputs once
and reproduces the torch code of llama.py up to float rounding: reductions and transcendentals
run in float32, and every value torch rounds to the input dtype is rounded here at the same
point, so bfloat16 results agree with torch to the last bit or the last but one.

The launches depend on shapes, strides and dtypes only (no host reads of tensor data), so they can
be captured in a CUDA graph and replayed with new data at the same shapes. Outputs are new
contiguous tensors; inside a graph they come from the graph's private pool. Rotary embedding is in
fused_rotary.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# Elements of one program's tile: a 4096-wide row, or many narrow rows (per-head q/k norms).
NORM_TILE = 2048
SILU_BLOCK = 1024


# n_rows is the step's token count: specialising on it (== 1, divisible by 16) would compile
# variants mid-run for step sizes the warm-up did not happen to use.
@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    new_res_ptr,
    n_rows,
    inner,  # rows of x per index of its first dim: 1 for [N, H], heads for [T, heads, H]
    H,
    eps,
    stride_x_outer,
    stride_x_inner,
    stride_res,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < n_rows)[:, None] & (cols < H)[None, :]
    x_rows = (rows // inner) * stride_x_outer + (rows % inner) * stride_x_inner
    x = tl.load(x_ptr + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    out_offsets = rows[:, None] * H + cols[None, :]  # outputs are contiguous [n_rows, H]
    dtype = x_ptr.dtype.element_ty
    if HAS_RESIDUAL:
        res_rows = rows * stride_res
        r = tl.load(res_ptr + res_rows[:, None] + cols[None, :], mask=mask, other=0.0)
        # Rounded to the input dtype as torch's x + residual is; the norm reads the rounded sum.
        h = (x + r.to(tl.float32)).to(dtype)
        tl.store(new_res_ptr + out_offsets, h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    # Cast to the input dtype before the weight multiplies it, as llama.RMSNorm does.
    normed = (x * rstd[:, None]).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    out = (w[None, :] * normed).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + out_offsets, out, mask=mask)


@triton.jit
def silu_times_up(row_ptr, cols, I, LIBDEVICE_EXP: tl.constexpr):
    """silu(gate) * up at cols of one [gate | up] row of I + I values, rounded to the row's dtype
    as torch rounds it (returned in float32; 0 past I). fp8_fused.py and fp8_silu_split.py
    quantize the same values."""
    mask = cols < I
    gate = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row_ptr + I + cols, mask=mask, other=0.0).to(tl.float32)
    return silu_mul(gate, up, row_ptr.dtype.element_ty, LIBDEVICE_EXP)


@triton.jit
def silu_mul(gate, up, dtype: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """silu(gate) * up from float32 values of dtype, rounded to dtype as torch rounds it (in
    float32); silu_times_up's arithmetic, and fp8_gemm_silu.py's on a GEMM's tile."""
    # torch's silu is x / (1 + expf(-x)) in float32 with an IEEE division; tl.exp and "/" are
    # approximate on the GPU, so use libdevice's expf there (the interpreter has no libdevice).
    if LIBDEVICE_EXP:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    act = tl.math.div_rn(gate, 1.0 + e).to(dtype).to(tl.float32)
    return (act * up).to(dtype).to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,
    out_ptr,
    I,
    stride_row,
    BLOCK: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    value = silu_times_up(gate_up_ptr + row * stride_row, cols, I, LIBDEVICE_EXP)
    tl.store(out_ptr + row * I + cols, value.to(out_ptr.dtype.element_ty), mask=cols < I)


def _check_rows(x: torch.Tensor, name: str) -> None:
    assert x.stride(-1) == 1, f"{name} needs contiguous rows (last stride 1)"


def _launch_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    _check_rows(x, "x")
    assert x.dim() in (2, 3) and weight.shape == (x.shape[-1],) and weight.is_contiguous()
    H = x.shape[-1]
    inner = x.shape[1] if x.dim() == 3 else 1
    stride_inner = x.stride(1) if x.dim() == 3 else 0
    n_rows = x.numel() // H
    out_dtype = torch.promote_types(weight.dtype, x.dtype)  # as torch's weight * normed
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    new_res = None
    if residual is not None:
        _check_rows(residual, "residual")
        assert residual.shape == x.shape and residual.dtype == x.dtype and x.dim() == 2
        new_res = residual_for(x, residual, residual_out)
    if n_rows == 0:
        return out, new_res
    block_h = triton.next_power_of_2(H)
    rows = max(1, NORM_TILE // block_h)
    _rms_norm_kernel[(triton.cdiv(n_rows, rows),)](
        x,
        x if residual is None else residual,  # unread without a residual
        weight,
        out,
        out if new_res is None else new_res,  # unwritten without a residual
        n_rows,
        inner,
        H,
        eps,
        x.stride(0),
        stride_inner,
        0 if residual is None else residual.stride(0),
        BLOCK_H=block_h,
        ROWS=rows,
        HAS_RESIDUAL=residual is not None,
        num_warps=min(16, max(1, block_h * rows // 512)),
    )
    return out, new_res


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the last dim of x [N, H] or [T, heads, H] (any strides but the last): new tensor.

    A [T, heads, H] view into a fused qkv output gives Qwen3's per-head q/k norm without a copy.
    """
    return _launch_norm(x, None, weight, eps)[0]


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) for x, residual [N, H], in one pass; new tensors,
    the sum in residual_out when given (a static buffer of engine/mixed_graphs.py's pieces)."""
    out, new_res = _launch_norm(x, residual, weight, eps, residual_out)
    assert new_res is not None
    return out, new_res


def residual_for(
    x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor | None
) -> torch.Tensor:
    """Where a norm's x + residual goes: residual_out (checked: contiguous, x's shape and dtype,
    and not residual itself, which other programs may still be reading), else a new tensor."""
    if residual_out is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if residual_out.shape != x.shape or residual_out.dtype != x.dtype:
        shape = tuple(residual_out.shape)
        raise ValueError(f"residual_out must be {tuple(x.shape)} {x.dtype}, got {shape}")
    if not residual_out.is_contiguous() or residual_out.data_ptr() == residual.data_ptr():
        raise ValueError("residual_out must be a contiguous tensor apart from residual")
    return residual_out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2I] = [gate | up] per row: a new [T, I] tensor."""
    _check_rows(gate_up, "gate_up")
    assert gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0
    T, I = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
    if T == 0:
        return out
    block = min(SILU_BLOCK, triton.next_power_of_2(I))
    _silu_and_mul_kernel[(T, triton.cdiv(I, block))](
        gate_up,
        out,
        I,
        gate_up.stride(0),
        BLOCK=block,
        LIBDEVICE_EXP=gate_up.is_cuda,
        num_warps=4,
    )
    return out
