"""Paged varlen prefill attention in Triton: causal flash attention over the paged KV cache.

Used for prefill and mixed steps (any query lengths). write_kv has already stored this step's keys
and values, so every sequence attends purely over its cache through its block-table row: query
row i of sequence b sits at position ctx_b + i (ctx_b = seq_len_b - query_len_b) and sees
positions 0..ctx_b + i.

Grid (number of query tiles, Hkv). A tile holds BLOCK_Q query positions of one sequence times the
GROUP query heads that share a kv-head, as BLOCK_M rows (row r: position r // GROUP, head
r % GROUP), so each K/V tile is loaded once for the whole group, and the few query rows of the
decoding sequences in a mixed step fill GROUP rows of a tile instead of one. Sequence b's tiles
are numbered from query_start_loc[b] // BLOCK_Q + b, which leaves room for every sequence's
partial last tile, so T // BLOCK_Q + B programs cover all of them; a program finds its sequence
by binary search over query_start_loc and exits if it falls in a gap. Each program keeps its
[BLOCK_M, D] query tile in registers and streams K/V tiles of BLOCK_N positions (tl.dot, online
softmax in base 2, fp32 accumulators): first the tiles wholly before the tile's first position,
which need no mask, then the few that cross the causal diagonal.

An fp8 cache (KV_FP8) is cast to the query's dtype as each tile is loaded; its layer scales are
folded out of the loop (k_scale into qk_scale, v_scale into the final normalisation). With
DOT_F16 (prefill_tiling.F16_PRODUCTS, on since it ran 18-20% faster on the H200) an 8-bit
cache's products run on fp16 operands as the decode kernel's do: e4m3 -> fp16 is one conversion
per two values where bf16 takes more (the kernel ran 5.3 ms a 1,648-token chunk over an fp8
cache against 3.5 over bf16 without it, H200 profile at 9141486), and the query is scaled
before its one rounding. With PV_FP8 (kv_fp8.FP8_PV, off until timed on a GPU) an fp8 cache's
P @ V runs on e4m3 operands: the weights times kv_fp8.P_SCALE against the cache's V bytes. An
int8 cache (KV_INT8) is cast as an fp8 one is (exact) and its scales per (token, kv head)
loaded with each tile: the scores times the key scales per column, the weights times the value
scales in P @ V only (triton_kv.scale_weights; l_i sums the unscaled weights). Tilings:
prefill_tiling.py; the loop over K/V tiles: prefill_attend.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.attention import prefill_tiling
from bulkgen.model.attention.kv_fp8 import P_SCALE, fp8_pv, is_fp8
from bulkgen.model.attention.kv_layout import v_slots_inner
from bulkgen.model.attention.prefill_attend import attend_tiles
from bulkgen.model.attention.prefill_tiling import (
    F16_PRODUCTS,
    _find_seq,
    invariant_tiles,
    prefill_tiles,
)
from bulkgen.model.attention.triton_kv import (
    check_cache,
    int8_asm,
    int8_scale_args,
    output_for,
)
from bulkgen.model.attention.triton_kv_pairs import first_partner
from bulkgen.model.fp8_kernels import hw_rounding
from bulkgen.model.switches import PREFILL_F16_ENV, switch

__all__ = ["invariant_tiles", "paged_prefill", "prefill_tiles"]

LOG2E = 1.4426950408889634
_P_INVERSE = tl.constexpr(1.0 / P_SCALE)


# num_seqs changes from step to step; Triton would compile a variant for each "== 1 / divisible by
# 16 / other" value of it in the middle of a run (seconds of idle GPU on the H200 bulk workload).
# It is a binary-search bound and gains nothing from the specialisation.
@triton.jit(do_not_specialize=["num_seqs"])
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    out_ptr,
    num_seqs,
    qk_scale,  # softmax scale * log2(e) (* k_scale for an fp8 cache)
    v_scale,  # an fp8 cache's value scale
    k_scales_ptr,  # an int8 cache's [num_blocks, block_size, Hkv] scales (else unused)
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
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query positions per tile
    BLOCK_M: tl.constexpr,  # tile rows: a power of two >= BLOCK_Q * GROUP
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    KV_INT8: tl.constexpr,
    V_SLOTS_INNER: tl.constexpr,  # kv_layout.py
    INVARIANT: tl.constexpr,  # every K/V tile through the one masked loop (triton_invariant.py)
    DOT_F16: tl.constexpr,  # an 8-bit cache's products on fp16 operands (paged_prefill)
    PV_FP8: tl.constexpr,  # an fp8 cache's P @ V on e4m3 operands (kv_fp8.FP8_PV)
    ROUND_P: tl.constexpr,  # its weights rounded in float32 before the cast (the interpreter)
    PAIRS: tl.constexpr,  # the first block's tiles add its partner's low parts (kv_pairs.py)
    INT8_ASM: tl.constexpr,  # int8 tiles widened through PTX (triton_kv.int8_to_f16)
):
    tile_id = tl.program_id(0)
    kv_head = tl.program_id(1)
    b = _find_seq(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    tile = tile_id - (q_start // BLOCK_Q + b)
    if tile * BLOCK_Q >= q_len:
        return

    # Row r of the tile is query tile * BLOCK_Q + r // GROUP of the sequence, head r % GROUP of
    # the group: every head of the group shares the K/V tiles loaded below.
    ctx = tl.load(seq_lens_ptr + b) - q_len
    r = tl.arange(0, BLOCK_M)
    query = tile * BLOCK_Q + r // GROUP
    heads = kv_head * GROUP + r % GROUP
    row_mask = (r < BLOCK_Q * GROUP) & (query < q_len)
    q_pos = ctx + query
    dims = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + query).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
        mask=row_mask[:, None],
        other=0.0,
    )
    if DOT_F16:  # scores come out scaled, as in triton_decode.py
        q = (q.to(tl.float32) * qk_scale).to(tl.float16)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    block_table_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    lo_block = first_partner(partners_ptr, block_table_row) if PAIRS else -1
    first_pos = ctx + tile * BLOCK_Q
    end = ctx + tl.minimum(q_len, (tile + 1) * BLOCK_Q)  # one past the last query's position
    unmasked_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # whole tiles at or before first_pos
    if INVARIANT:  # no unmasked loop (it would fold away): every tile runs the same masked code
        unmasked_end = 0
    # With PAIRS the first block's tiles run in loops of their own (LOW), before each range.
    first_end: tl.constexpr = tl.cdiv(BLOCK_SIZE, BLOCK_N) * BLOCK_N
    low_end = tl.minimum(unmasked_end, first_end) if PAIRS else 0
    causal_low_end = tl.maximum(unmasked_end, tl.minimum(end, first_end)) if PAIRS else unmasked_end
    # fmt: off
    if PAIRS:
        acc, l_i, m_i = attend_tiles(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, kv_head,
            0, low_end, qk_scale, k_scales_ptr, v_scales_ptr, stride_scale_block,
            stride_scale_slot, stride_cache_block, stride_cache_slot, stride_cache_head,
            stride_v_block, stride_v_slot, stride_v_head, stride_v_dim, lo_block,
            BLOCK_SIZE, BLOCK_N, HEAD_DIM, DOT_PRECISION, False, KV_FP8, KV_INT8, V_SLOTS_INNER,
            DOT_F16, PV_FP8, ROUND_P, True, INT8_ASM,
        )
    acc, l_i, m_i = attend_tiles(
        acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, kv_head,
        low_end, unmasked_end, qk_scale, k_scales_ptr, v_scales_ptr, stride_scale_block,
        stride_scale_slot, stride_cache_block, stride_cache_slot, stride_cache_head,
        stride_v_block, stride_v_slot, stride_v_head, stride_v_dim, lo_block,
        BLOCK_SIZE, BLOCK_N, HEAD_DIM, DOT_PRECISION, False, KV_FP8, KV_INT8, V_SLOTS_INNER,
        DOT_F16, PV_FP8, ROUND_P, False, INT8_ASM,
    )
    if PAIRS:
        acc, l_i, m_i = attend_tiles(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, kv_head,
            unmasked_end, causal_low_end, qk_scale, k_scales_ptr, v_scales_ptr,
            stride_scale_block, stride_scale_slot, stride_cache_block, stride_cache_slot,
            stride_cache_head, stride_v_block, stride_v_slot, stride_v_head, stride_v_dim,
            lo_block, BLOCK_SIZE, BLOCK_N, HEAD_DIM, DOT_PRECISION, True, KV_FP8, KV_INT8,
            V_SLOTS_INNER, DOT_F16, PV_FP8, ROUND_P, True, INT8_ASM,
        )
    acc, l_i, m_i = attend_tiles(
        acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table_row, kv_head,
        causal_low_end, end, qk_scale, k_scales_ptr, v_scales_ptr, stride_scale_block,
        stride_scale_slot, stride_cache_block, stride_cache_slot, stride_cache_head,
        stride_v_block, stride_v_slot, stride_v_head, stride_v_dim, lo_block,
        BLOCK_SIZE, BLOCK_N, HEAD_DIM, DOT_PRECISION, True, KV_FP8, KV_INT8, V_SLOTS_INNER,
        DOT_F16, PV_FP8, ROUND_P, False, INT8_ASM,
    )
    # fmt: on

    if KV_FP8:
        out = acc * (v_scale / l_i)[:, None]
        if PV_FP8:  # the weights went through e4m3 times P_SCALE, a power of two: exact
            out = out * _P_INVERSE
    else:
        out = acc / l_i[:, None]
    num_q_heads = tl.num_programs(1) * GROUP
    out_rows = out_ptr + (q_rows[:, None] * num_q_heads + heads[:, None]) * HEAD_DIM
    tl.store(out_rows + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    scale: float,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    invariant: bool = False,
    out: torch.Tensor | None = None,
    tiling: tuple[int, int, int, int] | None = None,
    f16_products: bool | None = None,
    partners: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] (rows grouped by query_start_loc) over the cache;
    k_scale/v_scale dequantize an fp8 cache (floats) or an int8 one (its scale tensors; ignored
    for others). invariant: the fixed tiling and single masked loop of triton_invariant.py
    (max_query_len is then unused). out: where to write (triton_kv.output_for). tiling: (BLOCK_M,
    BLOCK_N, warps, stages) instead of prefill_launch's (scripts/bench_prefill_tiles.py times
    candidates; stages 0: Triton's default). f16_products: an 8-bit cache's
    products on fp16 operands (None: F16_PRODUCTS, or BULKGEN_PREFILL_F16=1/0; a 16-bit query
    only). partners: an fp8 cache's first-block partners (kv_pairs.py)."""
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    check_cache(k_cache, v_cache, head_dim)
    assert num_q_heads % num_kv_heads == 0
    num_seqs = seq_lens.shape[0]
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = output_for(out, q)
    if num_tokens == 0:
        return out
    group = num_q_heads // num_kv_heads
    fp8 = is_fp8(k_cache)
    scale_args, int8 = int8_scale_args(k_cache, v_cache, k_scale, v_scale)
    warps, stages = 4, 0  # 4 warps fixed in the invariant mode: its reductions depend on it
    if invariant:
        block_q, block_m, block_n = invariant_tiles(group, head_dim)
    elif tiling is not None:
        block_m, block_n, warps, stages = tiling
        block_q = block_m // group
    else:
        long_ok = q.dtype != torch.float32 and not int8
        block_q, block_m, block_n, warps, stages = prefill_tiling.prefill_launch(
            max_query_len, group, head_dim, fp8, long_ok
        )
    pairs = partners is not None and fp8
    pv_fp8 = not invariant and not pairs and fp8_pv(q, v_cache)
    _prefill_kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        query_start_loc,
        seq_lens,
        block_tables,
        out,
        num_seqs,
        scale * LOG2E * (k_scale if fp8 else 1.0),
        v_scale if fp8 else 1.0,
        *scale_args,
        seq_lens if partners is None else partners,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        *v_cache.stride(),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_FP8=fp8,
        KV_INT8=int8,
        V_SLOTS_INNER=v_slots_inner(v_cache),
        INVARIANT=invariant,
        DOT_F16=(fp8 or int8)
        and q.dtype != torch.float32
        and (switch(PREFILL_F16_ENV, F16_PRODUCTS) if f16_products is None else f16_products),
        PV_FP8=pv_fp8,
        ROUND_P=pv_fp8 and not hw_rounding(q.device),
        PAIRS=pairs,
        INT8_ASM=int8 and int8_asm(q.device),
        num_warps=warps,
        **({"num_stages": stages} if stages else {}),
    )
    return out
