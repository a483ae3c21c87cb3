"""The split-KV decode kernel itself: triton_decode.py (paged_decode launches it) says how it is
built and why; each program's loop body is decode_tile.py's, its variants' parts live in
decode_mma.py (MMA_FP8), triton_decode_rotary.py (ROTATE) and triton_kv_pairs.py (PAIRS)."""

from __future__ import annotations

import triton
import triton.language as tl

from bulkgen.model.attention.decode_mma import attend_mma
from bulkgen.model.attention.decode_tile import decode_tile
from bulkgen.model.attention.triton_decode_rotary import rotate, write_at_its_split
from bulkgen.model.attention.triton_kv import kv_tile_blocks
from bulkgen.model.attention.triton_kv_pairs import first_partner


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    qk_scale,  # softmax scale * log2(e) (* k_scale for an fp8 cache)
    v_scale,  # an fp8 cache's value scale
    k_scales_ptr,  # an int8 cache's scales [num_blocks, block_size, Hkv] (else unused)
    v_scales_ptr,
    stride_scale_block,
    stride_scale_slot,
    partners_ptr,  # an fp8 cache's first-block partners (kv_pairs.py; else unused)
    stride_qt,
    stride_qh,
    stride_bt,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_v_dim,
    k_new_ptr,  # ROTATE's (decode_rotary.py): the step's unrotated keys and values [B, Hkv, D]
    v_new_ptr,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    stride_cos,
    stride_sin,
    slot_ptr,
    k_inv_scale,
    v_inv_scale,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_INT8: tl.constexpr,
    DOT_F16: tl.constexpr,
    V_IN_REGISTERS: tl.constexpr,
    V_SLOTS_INNER: tl.constexpr,
    PREFETCH_BLOCKS: tl.constexpr,
    PAIRS: tl.constexpr,  # add the partner's low parts to the first block's positions
    INT8_ASM: tl.constexpr,  # int8 tiles widened through PTX (triton_kv.int8_to_f16)
    MMA_FP8: tl.constexpr,  # an fp8 cache's products in e4m3 (decode_mma.py)
    ROUND_MMA: tl.constexpr,  # its e4m3 roundings done in float32 first (the interpreter)
    ROTATE: tl.constexpr,  # q unrotated; rotate it, and rotate and write the step's k and v
    ROUND_PTX: tl.constexpr,  # ROTATE's roundings through PTX (decode_rotary.round_to)
    HEADS_FIRST: tl.constexpr,  # grid (Hkv, B, S) rather than (B, Hkv, S) (DecodeLaunch)
):
    if HEADS_FIRST:
        kv_head = tl.program_id(0)
        b = tl.program_id(1)
        num_q_heads = tl.num_programs(0) * GROUP
    else:
        b = tl.program_id(0)
        kv_head = tl.program_id(1)
        num_q_heads = tl.num_programs(1) * GROUP
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + b * stride_qt + heads[:, None] * stride_qh
    if ROTATE:
        dtype = q_ptr.dtype.element_ty
        position = tl.load(positions_ptr + b).to(tl.int64)  # the new token's
        q = rotate(
            q_rows, head_mask[:, None], position, cos_ptr, sin_ptr, stride_cos, stride_sin, dtype,
            HEAD_DIM, ROUND_PTX,
        ).to(dtype)  # fmt: skip
    else:
        q = tl.load(q_rows + dims[None, :], mask=head_mask[:, None], other=0.0)
    if DOT_F16 and not MMA_FP8:  # scores come out scaled; fp16 keeps 3 bits more than bf16
        q = (q.to(tl.float32) * qk_scale).to(tl.float16)

    seq_len = tl.load(seq_lens_ptr + b)
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)
    if ROTATE:  # the split holding the last position writes the new token before reading it
        write_at_its_split(
            b, kv_head, split, seq_len, tiles_per_split, position, slot_ptr, k_new_ptr, v_new_ptr,
            stride_knt, stride_knh, stride_vnt, stride_vnh, cos_ptr, sin_ptr, stride_cos,
            stride_sin, k_cache_ptr, v_cache_ptr, k_inv_scale, v_inv_scale, stride_cache_block,
            stride_cache_slot, stride_cache_head, stride_v_block, stride_v_slot, stride_v_head,
            stride_v_dim, q_ptr.dtype.element_ty, HEAD_DIM, BLOCK_SIZE, BLOCK_N, KV_FP8, ROUND_PTX,
        )  # fmt: skip

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    block_table_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    if MMA_FP8:  # e4m3 products on the cache's bytes (decode_mma.py)
        acc, l_i, m_i = attend_mma(
            q, lo, hi, block_table_row, k_cache_ptr, v_cache_ptr, kv_head, qk_scale,
            stride_cache_block, stride_cache_slot, stride_cache_head, stride_v_block,
            stride_v_slot, stride_v_head, stride_v_dim, GROUP_PAD, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
            PREFETCH_BLOCKS, ROUND_MMA,
        )  # fmt: skip
    else:
        main_lo, lo_block = lo, lo  # lo_block: read only by the first block's tiles
        if PAIRS:  # the first block's tiles apart, with its partner's low parts (kv_pairs.py)
            lo_block = first_partner(partners_ptr, block_table_row)
            # A multiple of BLOCK_N, as lo is, said to the compiler: the main loop's loads stay
            # vector (a bound through min(hi, ...) took sm_90's kernel from 122 registers to 237).
            first_main = tl.cdiv(BLOCK_SIZE, BLOCK_N) * BLOCK_N
            main_lo = tl.multiple_of(tl.maximum(lo, first_main), BLOCK_N)
            # Narrow tiles, not software-pipelined: a whole tile and its low parts would take the
            # registers and shared memory of the kernel's every loop (240 registers and 104 KB
            # against 122 and 40 KB for sm_90 at 128-token tiles: half the CTAs a SM).
            LOW_N: tl.constexpr = BLOCK_N if BLOCK_N < 32 else 32
            for start in tl.range(lo, tl.minimum(main_lo, hi), LOW_N, num_stages=1):
                pos = start + tl.arange(0, LOW_N)
                blocks = kv_tile_blocks(block_table_row, pos, hi, BLOCK_SIZE)
                acc, l_i, m_i = decode_tile(
                    acc, l_i, m_i, pos, blocks, lo_block, q, hi, k_cache_ptr, v_cache_ptr, kv_head,
                    qk_scale, k_scales_ptr, v_scales_ptr, stride_scale_block, stride_scale_slot,
                    stride_cache_block, stride_cache_slot, stride_cache_head, stride_v_block,
                    stride_v_slot, stride_v_head, stride_v_dim, HEAD_DIM, BLOCK_SIZE, LOW_N,
                    DOT_PRECISION, KV_FP8, KV_INT8, DOT_F16, V_IN_REGISTERS, V_SLOTS_INNER, True,
                    INT8_ASM,
                )  # fmt: skip
        if PREFETCH_BLOCKS:  # the first tile's block ids; each iteration loads the next tile's
            next_blocks = kv_tile_blocks(
                block_table_row, main_lo + tl.arange(0, BLOCK_N), hi, BLOCK_SIZE
            )
        for start in range(main_lo, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            if PREFETCH_BLOCKS:
                blocks = next_blocks
                next_blocks = kv_tile_blocks(block_table_row, pos + BLOCK_N, hi, BLOCK_SIZE)
            else:
                blocks = kv_tile_blocks(block_table_row, pos, hi, BLOCK_SIZE)
            acc, l_i, m_i = decode_tile(
                acc, l_i, m_i, pos, blocks, lo_block, q, hi, k_cache_ptr, v_cache_ptr, kv_head,
                qk_scale, k_scales_ptr, v_scales_ptr, stride_scale_block, stride_scale_slot,
                stride_cache_block, stride_cache_slot, stride_cache_head, stride_v_block,
                stride_v_slot, stride_v_head, stride_v_dim, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
                DOT_PRECISION, KV_FP8, KV_INT8, DOT_F16, V_IN_REGISTERS, V_SLOTS_INNER, False,
                INT8_ASM,
            )  # fmt: skip

    # An empty split (or a padding row with seq_len 0) has l_i == 0: write out = 0, lse = -inf.
    has_work = l_i > 0
    l_safe = tl.where(has_work, l_i, 1.0)
    if KV_FP8:
        out = acc * (v_scale / l_safe)[:, None]
    else:
        out = acc / l_safe[:, None]
    if num_splits == 1:
        out_rows = out_ptr + b * num_q_heads * HEAD_DIM + heads[:, None] * HEAD_DIM
        tl.store(
            out_rows + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None]
        )
    else:
        part = (b * num_q_heads + heads) * num_splits + split
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], out, mask=head_mask[:, None]
        )
        lse = tl.where(has_work, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=head_mask)
