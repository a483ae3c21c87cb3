"""The prefill kernel's inner loop (triton_prefill.py): one program's online-softmax update over
the K/V tiles of positions lo..hi-1 of its sequence, read through the block table, with or
without the causal mask; an 8-bit cache cast as each tile is loaded (see triton_prefill.py for
the scales and DOT_F16)."""

from __future__ import annotations

import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import P_SCALE
from bulkgen.model.attention.triton_kv import (
    int8_to_f16,
    kv_tile_blocks,
    kv_tile_offsets,
    load_scales,
    load_v_tile,
    scale_weights,
)
from bulkgen.model.attention.triton_kv_pairs import add_low_k, add_low_v
from bulkgen.model.fp8_kernels import _round_e4m3

_P_SCALE = tl.constexpr(P_SCALE)


@triton.jit
def attend_tiles(
    acc,
    l_i,
    m_i,
    q,
    q_pos,  # [BLOCK_M] position of each query row
    k_cache_ptr,
    v_cache_ptr,
    block_table_row,
    kv_head,
    lo,
    hi,
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
    lo_block,  # the first block's partner (PAIRS; triton_kv_pairs.first_partner)
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    CAUSAL: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_INT8: tl.constexpr,
    V_SLOTS_INNER: tl.constexpr,
    DOT_F16: tl.constexpr,  # q came scaled by qk_scale, in fp16 (see the module's docstring)
    PV_FP8: tl.constexpr,  # P @ V on e4m3 operands, the weights times P_SCALE (kv_fp8.FP8_PV)
    ROUND_P: tl.constexpr,  # PV_FP8's weights rounded before the cast (the interpreter's truncates)
    LOW: tl.constexpr,  # tiles of the first block: add its partner's low parts (kv_pairs.py)
    INT8_ASM: tl.constexpr,  # int8 tiles widened through PTX (triton_kv.int8_to_f16)
):
    """Online-softmax update of (acc, l_i, m_i) with the cached positions lo..hi-1."""
    dims = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        blocks = kv_tile_blocks(block_table_row, pos, hi, BLOCK_SIZE)
        rows = kv_tile_offsets(
            blocks, pos, kv_head, stride_cache_block, stride_cache_slot, stride_cache_head,
            BLOCK_SIZE,
        )  # fmt: skip
        v_rows = kv_tile_offsets(
            blocks, pos, kv_head, stride_v_block, stride_v_slot, stride_v_head, BLOCK_SIZE
        )
        k_t = tl.load(k_cache_ptr + rows[None, :] + dims[:, None], mask=valid[None, :], other=0.0)
        if KV_INT8 and DOT_F16:
            k_t = int8_to_f16(k_t, INT8_ASM)
        elif KV_FP8 or KV_INT8:
            k_t = k_t.to(q.dtype)
        if LOW:  # a loop of its own: a branch on the position would slow every tile's
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
        visible = valid[None, :]
        if CAUSAL:
            visible = visible & (pos[None, :] <= q_pos[:, None])
            s = tl.where(visible, s, float("-inf"))
        # Position 0 is in every row's first tile, so m_new is finite from the first tile on.
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
        elif (KV_FP8 and not PV_FP8) or KV_INT8:
            v = v.to(q.dtype)
        if LOW:  # never with PV_FP8 (paged_prefill)
            v = add_low_v(
                v, v_cache_ptr, lo_block, pos, valid, hi, kv_head, stride_v_block, stride_v_slot,
                stride_v_head, stride_v_dim, HEAD_DIM, BLOCK_SIZE, BLOCK_N, V_SLOTS_INNER,
            )  # fmt: skip
        if KV_INT8:
            p_v, v_top = scale_weights(p, v_s, visible)
            p_v = tl.dot(p_v.to(v.dtype), v, input_precision=DOT_PRECISION) * v_top
        elif PV_FP8:
            w = p * _P_SCALE
            if ROUND_P:
                w = _round_e4m3(w)
            p_v = tl.dot(w.to(v.dtype), v)
        else:
            p_v = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + p_v
        m_i = m_new
    return acc, l_i, m_i
