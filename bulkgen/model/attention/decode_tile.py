"""The decode kernel's step over one K/V tile (triton_decode.py): the online-softmax update of a
program's (acc, l_i, m_i) with the tile of positions pos, read through their cache blocks. LOW
(a constexpr, so the loops that run without it compile as before): the tile lies in a
sequence's first block and adds its partner's low parts (kv_pairs.py). A branch on the tile's
position inside the main loop instead halved the kernel's speed on the H200 (trt FP8, 208561b:
decode steps 44 ms against 22): the decode kernel runs the first block's tiles in a loop of
their own."""

from __future__ import annotations

import triton
import triton.language as tl

from bulkgen.model.attention.triton_kv import (
    int8_to_f16,
    kv_tile_offsets,
    load_scales,
    load_v_tile,
    scale_weights,
)
from bulkgen.model.attention.triton_kv_pairs import add_low_k, add_low_v


@triton.jit
def decode_tile(
    acc,
    l_i,
    m_i,
    pos,  # [BLOCK_N] the tile's positions
    blocks,  # [BLOCK_N] their cache blocks (kv_tile_blocks)
    lo_block,  # the first block's partner (LOW only)
    q,
    hi,  # one past the last position of the split
    k_cache_ptr,
    v_cache_ptr,
    kv_head,
    qk_scale,
    k_scales_ptr,
    v_scales_ptr,
    stride_scale_block,
    stride_scale_slot,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_v_dim,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_INT8: tl.constexpr,
    DOT_F16: tl.constexpr,
    V_IN_REGISTERS: tl.constexpr,
    V_SLOTS_INNER: tl.constexpr,
    LOW: tl.constexpr,
    INT8_ASM: tl.constexpr,  # an int8 tile widened through PTX (triton_kv.int8_to_f16)
):
    """(acc, l_i, m_i) updated with the tile; see triton_decode.py for the arguments."""
    dims = tl.arange(0, HEAD_DIM)
    valid = pos < hi
    rows = kv_tile_offsets(
        blocks, pos, kv_head, stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE
    )
    v_rows = kv_tile_offsets(
        blocks, pos, kv_head, stride_v_block, stride_v_slot, stride_v_head, BLOCK_SIZE
    )
    k_t = tl.load(k_cache_ptr + rows[None, :] + dims[:, None], mask=valid[None, :], other=0.0)
    if KV_INT8 and DOT_F16:
        k_t = int8_to_f16(k_t, INT8_ASM)
    elif KV_FP8 or KV_INT8:
        k_t = k_t.to(q.dtype)
    if LOW:
        k_t = add_low_k(
            k_t, k_cache_ptr, lo_block, pos, valid, kv_head, stride_cache_block,
            stride_cache_slot, stride_cache_head, HEAD_DIM, BLOCK_SIZE,
        )  # fmt: skip
    s = tl.dot(q, k_t, input_precision=DOT_PRECISION)
    if not DOT_F16:
        s = s * qk_scale
    if KV_INT8:
        k_s, v_s = load_scales(
            k_scales_ptr, v_scales_ptr, blocks, pos, kv_head, valid,
            stride_scale_block, stride_scale_slot, BLOCK_SIZE,
        )  # fmt: skip
        s = s * k_s[None, :]
    s = tl.where(valid[None, :], s, float("-inf"))
    # Every tile has a valid position, so m_new is finite and alpha is 0 on the first tile.
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = load_v_tile(
        v_cache_ptr, v_rows, pos, valid, hi, stride_v_dim, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
        V_SLOTS_INNER,
    )  # fmt: skip
    if KV_INT8 and DOT_F16:
        v = int8_to_f16(v, INT8_ASM)
    elif KV_FP8 or KV_INT8:
        v = v.to(q.dtype)
    if V_IN_REGISTERS:  # see DecodeLaunch: the select keeps the tile out of byte reads
        v = tl.where(valid[:, None], v, 0.0).to(q.dtype)
    if LOW:
        v = add_low_v(
            v, v_cache_ptr, lo_block, pos, valid, hi, kv_head, stride_v_block, stride_v_slot,
            stride_v_head, stride_v_dim, HEAD_DIM, BLOCK_SIZE, BLOCK_N, V_SLOTS_INNER,
        )  # fmt: skip
    if KV_INT8:
        p_v, v_top = scale_weights(p, v_s, valid[None, :])
        p_v = tl.dot(p_v.to(v.dtype), v, input_precision=DOT_PRECISION) * v_top
    else:
        p_v = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc * alpha[:, None] + p_v, l_i, m_new
