"""Rotary position embedding of q and k in one Triton launch ("rotate_half", non-interleaved).

Program t rotates every query and key head of token t with the cos/sin row of positions[t], so
the table row is read once per token. q and k may be strided views into the fused qkv projection
(only the last dim must be contiguous); the results are new contiguous tensors and the inputs are
left unchanged. Arithmetic follows llama.Rotary: cos/sin are rounded to q's dtype, each product is
rounded to it, and so is each sum: the same roundings, in the same order, as torch's.
Shapes, strides and dtypes are the only host values used: safe to capture in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    x_row,
    out_row,
    stride_h,
    c,
    s,
    HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """Rotates the HEADS heads of one token; c and s are [HALF_PAD] float32 rows."""
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HALF_PAD)
    mask = (heads < HEADS)[:, None] & (dims < HALF)[None, :]
    first = x_row + heads[:, None] * stride_h + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = out_row.dtype.element_ty
    c, s = c[None, :], s[None, :]
    # Each product is rounded to dtype before the sum, as torch's x1 * cos is. The compiler would
    # otherwise fuse x1 * c - p into one FMA that skips that rounding (it does, in bfloat16), so
    # the launch disables FP fusion.
    o1 = (x1 * c).to(dtype).to(tl.float32) - (x2 * s).to(dtype).to(tl.float32)
    o2 = (x2 * c).to(dtype).to(tl.float32) + (x1 * s).to(dtype).to(tl.float32)
    out = out_row + heads[:, None] * (2 * HALF) + dims[None, :]
    tl.store(out, o1.to(dtype), mask=mask)
    tl.store(out + HALF, o2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    Q_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    rotate_token(
        tl.program_id(0).to(tl.int64), q_ptr, k_ptr, positions_ptr, cos_ptr, sin_ptr,
        q_out_ptr, k_out_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, stride_sin,
        Q_HEADS, Q_HEADS_PAD, K_HEADS, K_HEADS_PAD, HALF, HALF_PAD,
    )  # fmt: skip


@triton.jit
def rotate_token(
    t,
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    Q_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """Token t's query and key heads rotated into rows t of q_out and k_out (contiguous): one
    program's work (_rotary_kernel's arguments), which rotary_write.py's fused launch runs too."""
    pos = tl.load(positions_ptr + t).to(tl.int64)
    dims = tl.arange(0, HALF_PAD)
    dim_mask = dims < HALF
    dtype = q_out_ptr.dtype.element_ty
    c = tl.load(cos_ptr + pos * stride_cos + dims, mask=dim_mask, other=0.0)
    s = tl.load(sin_ptr + pos * stride_sin + dims, mask=dim_mask, other=0.0)
    c = c.to(dtype).to(tl.float32)  # the tables are float32; torch rounds them to q's dtype
    s = s.to(dtype).to(tl.float32)
    q_out_row = q_out_ptr + t * (Q_HEADS * 2 * HALF)
    k_out_row = k_out_ptr + t * (K_HEADS * 2 * HALF)
    q_row, k_row = q_ptr + t * stride_qt, k_ptr + t * stride_kt
    _rotate_heads(q_row, q_out_row, stride_qh, c, s, Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD)
    _rotate_heads(k_row, k_out_row, stride_kh, c, s, K_HEADS, K_HEADS_PAD, HALF, HALF_PAD)


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q [T, Hq, D] and k [T, Hk, D] at positions [T] (tables [max_pos, D/2])."""
    T, q_heads, head_dim = q.shape
    assert k.dim() == 3 and k.shape[0] == T and k.shape[2] == head_dim and k.dtype == q.dtype
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "q and k need a contiguous last dim"
    assert head_dim % 2 == 0 and cos.shape[-1] == head_dim // 2 and sin.shape == cos.shape
    assert cos.stride(-1) == 1 and sin.stride(-1) == 1 and positions.shape == (T,)
    k_heads, half = k.shape[1], head_dim // 2
    q_out = torch.empty((T, q_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((T, k_heads, head_dim), dtype=k.dtype, device=k.device)
    if T == 0:
        return q_out, k_out
    q_heads_pad, k_heads_pad = triton.next_power_of_2(q_heads), triton.next_power_of_2(k_heads)
    half_pad = triton.next_power_of_2(half)
    tile = (q_heads_pad + k_heads_pad) * half_pad * 2  # elements a program moves
    _rotary_kernel[(T,)](
        q,
        k,
        positions,
        cos,
        sin,
        q_out,
        k_out,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        Q_HEADS=q_heads,
        Q_HEADS_PAD=q_heads_pad,
        K_HEADS=k_heads,
        K_HEADS_PAD=k_heads_pad,
        HALF=half,
        HALF_PAD=half_pad,
        num_warps=min(8, triton.next_power_of_2(max(1, tile // 1024))),  # a power of two
        enable_fp_fusion=False,  # see _rotate_heads
    )
    return q_out, k_out
