"""The decode launch's deferred value write (decode_values.py: why and when), as Triton functions
that triton_decode_kernel._decode_split_kernel calls under DEFER_V."""

from __future__ import annotations

import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import FP8_MAX

_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def holds_new_token(b, split, seq_len, tiles_per_split, slot_ptr, BLOCK_N: tl.constexpr):
    """(new, slot): whether program (b, ., split) adds row b's last position (the new token's)
    after its loop, which then leaves it out: its split holds it, the row is not padding."""
    writer = (tl.cdiv(seq_len, BLOCK_N) - 1) // tl.maximum(tiles_per_split, 1)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    return (split == writer) & (slot >= 0) & (seq_len > 0), slot


@triton.jit
def add_new_token(
    acc, l_i, m_i, q, new, slot, b, kv_head, k_cache_ptr, v_cache_ptr, v_new_ptr, stride_vnt,
    stride_vnh, qk_scale, v_inv_scale, stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_v_block, stride_v_slot, stride_v_head, stride_v_dim, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, QUANTIZE: tl.constexpr, DOT_F16: tl.constexpr,
):  # fmt: skip
    """(acc, l_i, m_i) with the new token's position added where `new` (unchanged elsewhere):
    its key read from the cache (rotary_write stored it), its value from v_new_ptr rounded as
    write_kv stores it and as decode_tile reads it back, then stored at the slot."""
    dims = tl.arange(0, HEAD_DIM)
    mask = dims < tl.where(new, HEAD_DIM, 0)  # (new & a vector: the interpreter's dtype fails)
    at = tl.where(new, slot, 0)
    block, offset = at // BLOCK_SIZE, at % BLOCK_SIZE
    k_at = block * stride_cache_block + offset * stride_cache_slot + kv_head * stride_cache_head
    k = tl.load(k_cache_ptr + k_at + dims, mask=mask, other=0.0).to(q.dtype)
    s = tl.sum(q.to(tl.float32) * k.to(tl.float32)[None, :], axis=1)
    if not DOT_F16:  # decode_tile's scaling: q came scaled under DOT_F16
        s = s * qk_scale
    v = tl.load(v_new_ptr + b * stride_vnt + kv_head * stride_vnh + dims, mask=mask, other=0.0)
    v = v.to(tl.float32)
    if QUANTIZE:  # write_token's fp8 arithmetic
        v = tl.clamp(v * v_inv_scale, -_FP8_MAX, _FP8_MAX)
    stored = v.to(v_cache_ptr.dtype.element_ty)
    v_at = block * stride_v_block + offset * stride_v_slot + kv_head * stride_v_head
    tl.store(v_cache_ptr + v_at + dims * stride_v_dim, stored, mask=mask)
    # decode_tile's update with a tile of this one position (m_i is -inf after an empty loop)
    m_new = tl.maximum(m_i, s)
    p = tl.exp2(s - m_new)
    alpha = tl.exp2(m_i - m_new)
    weight = p.to(q.dtype).to(tl.float32)  # as tl.dot(p.to(v.dtype), v) takes it
    p_v = weight[:, None] * stored.to(q.dtype).to(tl.float32)[None, :]
    acc = tl.where(new, acc * alpha[:, None] + p_v, acc)
    l_i = tl.where(new, l_i * alpha + p, l_i)
    m_i = tl.where(new, m_new, m_i)
    return acc, l_i, m_i
