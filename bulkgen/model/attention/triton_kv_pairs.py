"""Triton helpers for an fp8 cache's paired first blocks (kv_pairs.py): the write's split of a
value into high and low e4m3 parts, and the attention kernels' low parts of a tile's positions
in the first block, added to the tile they loaded.

The split rounds with fp8_kernels._round_e4m3 (to nearest, ties to even, as torch's cast and the
GPU's do), so both parts lie on the e4m3 grid and their casts are exact everywhere, the Triton
interpreter included (its own cast drops the carry into the exponent). The attention kernels add
a partner's tile only to their tiles that start below block_size (a runtime branch once per
tile): every other tile of a sequence lies past its first block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import FP8_MAX
from bulkgen.model.attention.kv_pairs import LO_SCALE
from bulkgen.model.attention.triton_kv import kv_tile_offsets, load_v_tile
from bulkgen.model.fp8_kernels import _round_e4m3

_LO_SCALE = tl.constexpr(LO_SCALE)
_LO_INVERSE = tl.constexpr(1.0 / LO_SCALE)
_FP8_MAX = tl.constexpr(FP8_MAX)


# The decode kernel's launch with pairs: at most this many registers a thread for 4-warp
# programs, so that 4 CTAs fit a SM as without pairs. For sm_90 at 128-token tiles ptxas takes
# 138 unbounded (122 without pairs: 3 CTAs a SM against 4) and 120 bounded, with no spills
# (scripts/kernel_resources.py's count; trt FP8 at 37f5d70 ran 9% slower unbounded).
PAIRS_MAX_REGISTERS = 128


def pairs_registers(pairs: bool, num_warps: int, device: torch.device) -> dict:
    """The launch option bounding a pairs launch's registers (none elsewhere, or on the
    interpreter, which has no registers)."""
    if not pairs or num_warps != 4 or device.type != "cuda":
        return {}
    return {"maxnreg": PAIRS_MAX_REGISTERS}


@triton.jit
def split_pair(x):
    """x (float32, in scale units, saturated) as (hi, lo), both float32 on the e4m3 grid:
    hi + lo * LO_SCALE stands for x."""
    hi = _round_e4m3(x)
    lo = _round_e4m3(tl.clamp((x - hi) * _LO_INVERSE, -_FP8_MAX, _FP8_MAX))
    return hi, lo


@triton.jit
def first_partner(partners_ptr, block_table_row):
    """The partner (int64) of the first block of a sequence's block-table row, or -1."""
    return tl.load(partners_ptr + tl.load(block_table_row)).to(tl.int64)


@triton.jit
def add_low_k(
    k_t,  # [HEAD_DIM, N] a tile's keys, widened
    k_cache_ptr,
    lo_block,  # first_partner
    pos,
    valid,
    kv_head,
    stride_block,
    stride_slot,
    stride_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """k_t with the low parts of its positions in the first block added, in k_t's dtype (fp16's
    11 bits hold a pair's 8 exactly; a float32 tile of the sum cost the decode kernel twice the
    registers)."""
    lo_blocks = lo_block + 0 * pos  # [N]
    paired = valid & (pos < BLOCK_SIZE) & (lo_blocks >= 0)
    rows = kv_tile_offsets(
        lo_blocks, pos, kv_head, stride_block, stride_slot, stride_head, BLOCK_SIZE
    )
    dims = tl.arange(0, HEAD_DIM)
    lo = tl.load(k_cache_ptr + rows[None, :] + dims[:, None], mask=paired[None, :], other=0.0)
    return k_t + (lo.to(k_t.dtype) * _LO_SCALE).to(k_t.dtype)


@triton.jit
def add_low_v(
    v,  # [N, HEAD_DIM] a tile's values, widened
    v_cache_ptr,
    lo_block,
    pos,
    valid,
    hi,  # one past the last position of the range being read
    kv_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_v_dim,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    V_SLOTS_INNER: tl.constexpr,
):
    """v with the low parts of its positions in the first block added (0 elsewhere)."""
    lo_blocks = lo_block + 0 * pos  # [N]
    paired = valid & (pos < BLOCK_SIZE) & (lo_blocks >= 0)
    rows = kv_tile_offsets(
        lo_blocks, pos, kv_head, stride_v_block, stride_v_slot, stride_v_head, BLOCK_SIZE
    )
    # Whole-block reads (slots inner) of the partner only: hi' is 0 when there is none.
    block_hi = tl.where(lo_block >= 0, tl.minimum(hi, BLOCK_SIZE), 0)
    lo = load_v_tile(
        v_cache_ptr, rows, pos, paired, block_hi, stride_v_dim, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
        V_SLOTS_INNER,
    )  # fmt: skip
    lo = tl.where(paired[:, None], lo.to(v.dtype), 0.0).to(v.dtype)
    return v + (lo * _LO_SCALE).to(v.dtype)
