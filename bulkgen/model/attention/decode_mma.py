"""The fp8 cache's decode loop on e4m3 tensor-core products (triton_decode.py, MMA_FP8): no K or
V tile is widened.

The 16-bit decode loop widens every key and value it reads to fp16 (a conversion per two bytes)
and multiplies on sm_90's mma.sync with the GROUP query heads of a kv head padded to 16 rows: at
32 rows x 1K context an fp8 launch read its cache at 3.37 TB/s per added token against bf16's
4.39 (scripts/bench_decode_layers.py at f85933e), twice the values a byte to widen and multiply.
Here the products run transposed, tokens as the M dimension, so that a 64- or 128-token tile
takes wgmma's e4m3 form with both operands as the cache stores them (keys head_dim contiguous,
values slots inner: both K-major):

- scores S^T [BLOCK_N, GROUP_PAD] = K8 [BLOCK_N, D] @ Q^T, the query (times qk_scale) held as
  two e4m3 parts per row, y = q * qk_scale / scale_row = hi + lo / 16 with scale_row a power of
  two that puts the row's largest |y| in [128, 256): two products, then (hi + lo / 16) * scale.
  The parts keep about 8 bits of each entry, a bf16 query's precision (one e4m3 part alone,
  scripts/accuracy_attn_fp8.py: KL 0.0117 against 0.0090 over the fp8 cache);
- out^T [D, GROUP_PAD] = V8^T [D, BLOCK_N] @ P8^T, the softmax weights p (<= 1) times P_SCALE
  rounded to e4m3 (kv_fp8.P_SCALE, as the prefill kernel's FP8_PV), the row sums l from the
  float32 p, and the output divided by P_SCALE (exact).

Off by default: on the H200 at a5fef9e (README, FP8 weights) the launch read 4.47 TB/s per added
token against 4.26 at 32 rows, blog FP8 ran 0.2-0.4% faster, bulk 0.3% and trt 0.9% slower; and
accuracy_attn_fp8.py's "Q hi/lo" rows (CPU, 1,852 positions) give the query's parts no cost
(top-1 0.9606 against 0.9617) but the e4m3 weights with them 0.9465 (mean KL unchanged, 0.0092).

ROUND: the e4m3 roundings done in float32 first (fp8_kernels._round_e4m3): the interpreter's
cast truncates, the GPU's rounds to nearest even (then the rounding is left to it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import P_SCALE, is_fp8
from bulkgen.model.attention.kv_layout import v_slots_inner
from bulkgen.model.attention.triton_kv import kv_tile_blocks, kv_tile_offsets
from bulkgen.model.fp8_kernels import _round_e4m3
from bulkgen.model.switches import DECODE_MMA_ENV, switch

# Off (see above); BULKGEN_FP8_DECODE_MMA (1/0) switches it for A/B runs.
DECODE_MMA = False
MIN_BLOCK_N = 64  # wgmma's M: a warp group's 64 rows (tokens here)
MIN_HEAD_DIM = 32  # an e4m3 product's K (the scores reduce over head_dim)

_P_SCALE = tl.constexpr(P_SCALE)
_LO_SCALE = tl.constexpr(16.0)  # the low part's factor: |y - hi| is at most 8 where |y| < 256


def mma_fp8(q: torch.Tensor, v_cache: torch.Tensor, block_n: int, pairs: bool) -> bool:
    """Whether a decode launch runs on e4m3 products (DECODE_MMA): an fp8 cache with values slots
    inner, a 16-bit query, tiles of at least MIN_BLOCK_N tokens, head_dim at least MIN_HEAD_DIM
    (the tiny test model's 16 failed to compile on the H200) and no paired first blocks."""
    eligible = is_fp8(v_cache) and v_slots_inner(v_cache) and q.dtype != torch.float32
    eligible = eligible and block_n >= MIN_BLOCK_N and q.shape[-1] >= MIN_HEAD_DIM and not pairs
    return eligible and switch(DECODE_MMA_ENV, DECODE_MMA)


@triton.jit
def _e4m3(x, ROUND: tl.constexpr):
    if ROUND:
        x = _round_e4m3(x)
    return x.to(tl.float8e4nv)


@triton.jit
def split_query(q, qk_scale, ROUND: tl.constexpr):
    """(hi^T, lo^T [D, GROUP_PAD] e4m3, scale [GROUP_PAD]) with q * qk_scale = (hi + lo / 16) *
    scale up to lo's rounding; scale a power of two (so the scaling is exact) per row."""
    y = q.to(tl.float32) * qk_scale
    absmax = tl.max(tl.abs(y), axis=1)
    biased = (absmax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # exponent of absmax, +127
    exponent = tl.minimum(tl.maximum(biased - 7, 1), 253)  # absmax / scale in [128, 256)
    scale = (exponent << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - exponent) << 23).to(tl.float32, bitcast=True)
    y = y * inverse[:, None]
    hi = _e4m3(y, ROUND)
    lo = _e4m3((y - hi.to(tl.float32)) * _LO_SCALE, ROUND)  # the difference is exact
    return tl.trans(hi), tl.trans(lo), scale


@triton.jit
def attend_mma(
    q,  # [GROUP_PAD, D] the group's query rows (16-bit; padding rows 0)
    lo,
    hi,  # the split's positions lo..hi-1
    block_table_row,
    k_cache_ptr,
    v_cache_ptr,
    kv_head,
    qk_scale,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_v_dim,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH_BLOCKS: tl.constexpr,
    ROUND: tl.constexpr,
):
    """(acc [GROUP_PAD, D] = sum of p * v, l_i, m_i) over the split, as the 16-bit loop returns
    them (scores in base 2, already scaled); values must be stored slots inner."""
    q_hi, q_lo, q_scale = split_query(q, qk_scale, ROUND)
    dims = tl.arange(0, HEAD_DIM)
    # Runs of a slots-inner block's tokens: contiguous, a tile starting on a multiple of BLOCK_N.
    RUN: tl.constexpr = BLOCK_SIZE if BLOCK_SIZE < BLOCK_N else BLOCK_N
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([HEAD_DIM, GROUP_PAD], tl.float32)  # transposed: out^T
    if PREFETCH_BLOCKS:
        next_blocks = kv_tile_blocks(block_table_row, lo + tl.arange(0, BLOCK_N), hi, BLOCK_SIZE)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        if PREFETCH_BLOCKS:
            blocks = next_blocks
            next_blocks = kv_tile_blocks(block_table_row, pos + BLOCK_N, hi, BLOCK_SIZE)
        else:
            blocks = kv_tile_blocks(block_table_row, pos, hi, BLOCK_SIZE)
        valid = pos < hi
        rows = kv_tile_offsets(
            blocks, pos, kv_head, stride_cache_block, stride_cache_slot, stride_cache_head,
            BLOCK_SIZE,
        )  # fmt: skip
        k = tl.load(k_cache_ptr + rows[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(k, q_hi) + tl.dot(k, q_lo) * (1.0 / _LO_SCALE)
        s = tl.where(valid[:, None], s * q_scale[None, :], float("-inf"))
        # Every tile has a valid position, so m_new is finite and alpha is 0 on the first tile.
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp2(s - m_new[None, :])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        # V^T [D, BLOCK_N]: whole blocks read (finite past hi in a zeroed or saturated cache),
        # weighted by p == 0 there, so that every run of BLOCK_SIZE tokens is one vector load.
        v_rows = kv_tile_offsets(
            blocks, pos, kv_head, stride_v_block, stride_v_slot, stride_v_head, BLOCK_SIZE
        )
        v_at = v_rows[None, :] + dims[:, None] * stride_v_dim
        v_at = tl.max_contiguous(tl.multiple_of(v_at, [1, RUN]), [1, RUN])
        in_table = pos // BLOCK_SIZE < tl.cdiv(hi, BLOCK_SIZE)
        v = tl.load(v_cache_ptr + v_at, mask=in_table[None, :], other=0.0)
        acc = acc * alpha[None, :] + tl.dot(v, _e4m3(p * _P_SCALE, ROUND))
        m_i = m_new
    return tl.trans(acc) * (1.0 / _P_SCALE), l_i, m_i
