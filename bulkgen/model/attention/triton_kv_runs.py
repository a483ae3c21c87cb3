"""Storing a step's values in an fp8 cache laid out slots inner (kv_layout.py), RUN tokens a
program, for steps with prefill (rotary_write.rotary_write_kv's v_runs).

Slots inner, a token's value for one dim lies 64 bytes (the block size) from its next dim's, so
the per-token write (triton_kv_write.write_token) stores each value byte alone: at a trt step's
8,192 tokens of the 8B shape 8.4 million one-byte stores a layer, and its fused rotary and cache
write took 130 us a layer on the H200 against 61 with a bf16 cache (scripts/bench_eager_host.py
--kernels, 72ac8cf). A prompt's tokens fill consecutive slots of a block, though: a program here
takes RUN consecutive tokens, and where their slots are consecutive within one block (a run) it
stores each dim's RUN bytes together, RUN lanes apart in one store; otherwise (sequences meeting,
a block boundary, the decoding rows of a mixed step, a graph's padding rows) each token's values
go to their own slots as before. The values are those write_token stores, bit for bit: x / scale
saturated to +-448 (times the reciprocal scale, as write_token does), rounded by the cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import FP8_MAX, is_fp8
from bulkgen.model.attention.kv_layout import v_slots_inner
from bulkgen.model.switches import KV_RUNS_ENV, switch

_FP8_MAX = tl.constexpr(FP8_MAX)
RUN = 16  # tokens a program: 16 consecutive bytes of a dim, half a 32-byte sector
ENABLED = True  # BULKGEN_KV_RUNS=0 turns it off (A/B runs)


@triton.jit(do_not_specialize=["num_tokens"])
def _write_v_runs_kernel(
    v_ptr,
    v_cache_ptr,
    slot_ptr,
    num_tokens,
    stride_vt,
    stride_vh,
    stride_v_block,
    stride_v_head,
    v_inv_scale,
    BLOCK_SIZE: tl.constexpr,  # the cache's slots a block, also each dim's stride (slots inner)
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    RUN: tl.constexpr,
):
    t0 = tl.program_id(0) * RUN
    r = tl.arange(0, RUN)
    tokens = t0 + r
    dims = tl.arange(0, HEAD_DIM)[None, :]
    valid = tokens < num_tokens
    slots = tl.load(slot_ptr + tokens, mask=valid, other=-1).to(tl.int64)
    first = tl.load(slot_ptr + t0).to(tl.int64)  # t0 < num_tokens: the grid covers no more
    offset = first % BLOCK_SIZE
    apart = tl.max(tl.abs(slots - (first + r)), axis=0)  # 0: a run, every token valid
    is_run = (apart == 0) & (first >= 0) & (offset + RUN <= BLOCK_SIZE)
    # offset + r is provably consecutive, so the compiler lays each dim's RUN bytes along lanes
    run_at = (first // BLOCK_SIZE) * stride_v_block + offset + r[:, None] + dims * BLOCK_SIZE
    token_at = (slots // BLOCK_SIZE)[:, None] * stride_v_block + (slots % BLOCK_SIZE)[:, None]
    token_at += dims * BLOCK_SIZE
    src = v_ptr + tokens.to(tl.int64)[:, None] * stride_vt + dims
    for head in tl.static_range(HEADS):  # a [RUN, HEAD_DIM] tile at a time
        v = tl.load(src + head * stride_vh, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.clamp(v * v_inv_scale, -_FP8_MAX, _FP8_MAX).to(v_cache_ptr.dtype.element_ty)
        if is_run:
            tl.store(v_cache_ptr + run_at + head * stride_v_head, v)
        else:
            at = v_cache_ptr + token_at + head * stride_v_head
            tl.store(at, v, mask=(valid & (slots >= 0))[:, None])


def runs_apply(v_cache: torch.Tensor, partners: torch.Tensor | None) -> bool:
    """Whether write_v_runs stores v_cache's values: an fp8 cache laid out slots inner, without
    first-block partners (whose low parts write_token writes), unless BULKGEN_KV_RUNS=0."""
    if not (is_fp8(v_cache) and v_slots_inner(v_cache) and partners is None):
        return False
    return switch(KV_RUNS_ENV, ENABLED)


def write_v_runs(
    v: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, v_scale: float
) -> None:
    """Store this step's values [T, Hkv, D] at their slots of an fp8 cache laid out slots inner
    (runs_apply), RUN tokens a program."""
    num_tokens, num_kv_heads, head_dim = v.shape
    if num_tokens == 0:
        return
    v = v if v.stride(-1) == 1 else v.contiguous()
    block_size = v_cache.shape[1]
    assert v_cache.stride(3) == block_size and v_cache.stride(1) == 1
    _write_v_runs_kernel[(triton.cdiv(num_tokens, RUN),)](
        v,
        v_cache,
        slot_mapping,
        num_tokens,
        v.stride(0),
        v.stride(1),
        v_cache.stride(0),
        v_cache.stride(2),
        1.0 / v_scale,
        BLOCK_SIZE=block_size,
        HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        RUN=RUN,
        num_warps=4,
    )
