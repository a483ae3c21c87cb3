"""Triton helpers for reading the paged KV cache, shared by the attention kernels, and the
argument checks every cache kernel makes (storing new keys/values: triton_kv_write.py).

kv_tile_offsets: the gather that both attention kernels use. A tile of consecutive token positions
of one sequence maps, token by token, to (block_tables[b, pos // block_size], pos % block_size), so
a tile may span several cache blocks and a block may be larger than a tile.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from bulkgen.model.attention.kv_int8 import is_int8
from bulkgen.model.switches import INT8_F16_ASM_ENV, switch


def int8_asm(device: torch.device) -> bool:
    """Whether the attention kernels launched on `device` widen int8 tiles to fp16 through
    int8_to_f16's PTX (CUDA, not the interpreter, which has no inline PTX; BULKGEN_INT8_F16_ASM=0
    turns it off for A/B runs)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return device.type == "cuda" and not interpreted and switch(INT8_F16_ASM_ENV, True)


@triton.jit
def int8_to_f16(x, ASM: tl.constexpr):
    """An int8 tile as float16 (exact: every int8 is an fp16 integer). ASM: four values a 32-bit
    register, each x + 128 (its sign bit flipped) put under the exponent byte 0x64 (fp16 1024.0,
    whose last place is 1) by byte permutes, then 1152.0 taken off two at a time: 5 instructions
    for 4 values. The cast takes sm_90 a cvt.rn.f16.s16 a value (a quarter of the ALU's rate)
    and as many moves: int8 decode then ran 1.5x fp8's step time on the H200 (trt, d3151d6).
    trt with the int8 cache at b7b0d2d: 10,906 tok/s; the cast instead (0315086, the next call)
    10,110."""
    if ASM:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 u, high, bias;
            xor.b32 u, $2, 0x80808080;
            mov.b32 high, 0x64646464;
            mov.b32 bias, 0x64806480;
            prmt.b32 $0, u, high, 0x4140;
            prmt.b32 $1, u, high, 0x4342;
            sub.f16x2 $0, $0, bias;
            sub.f16x2 $1, $1, bias;
            }""",
            constraints="=r,=r,r",
            args=[x],
            dtype=tl.float16,
            is_pure=True,
            pack=4,
        )
    return x.to(tl.float16)


@triton.jit
def kv_tile_blocks(
    block_table_row,  # pointer to this sequence's row of block_tables
    pos,  # [N] token positions in the sequence
    hi,  # one past the last position of the range being read
    BLOCK_SIZE: tl.constexpr,
):
    """The cache block (int64) holding each position: one gather, shared by K and V. Read for
    every position of a block that holds one below hi (such a block is in the table), so that
    a slots-inner V tile (load_v_tile) addresses whole blocks."""
    in_table = pos // BLOCK_SIZE < tl.cdiv(hi, BLOCK_SIZE)
    # int64: a large cache holds more than 2**31 elements.
    return tl.load(block_table_row + pos // BLOCK_SIZE, mask=in_table, other=0).to(tl.int64)


@triton.jit
def kv_tile_offsets(
    blocks,  # [N] kv_tile_blocks of the positions
    pos,
    kv_head,
    stride_block,
    stride_slot,
    stride_head,
    BLOCK_SIZE: tl.constexpr,
):
    """Element offsets (int64) of the first head_dim entry of each position's key/value row."""
    return blocks * stride_block + (pos % BLOCK_SIZE) * stride_slot + kv_head * stride_head


@triton.jit
def load_scales(
    k_scales_ptr,
    v_scales_ptr,
    blocks,  # [N] kv_tile_blocks of the positions
    pos,
    kv_head,
    valid,
    stride_scale_block,
    stride_scale_slot,
    BLOCK_SIZE: tl.constexpr,
):
    """An int8 cache's key and value scales [N] of the positions (0 where not valid: the weight
    of an absent value is then 0 whatever the scale slot held)."""
    at = kv_tile_offsets(blocks, pos, kv_head, stride_scale_block, stride_scale_slot, 1, BLOCK_SIZE)
    k_s = tl.load(k_scales_ptr + at, mask=valid, other=0.0)
    v_s = tl.load(v_scales_ptr + at, mask=valid, other=0.0)
    return k_s, v_s


@triton.jit
def scale_weights(p, v_s, visible):
    """(P times the value scales per column over each row's largest visible one, that scale
    [rows, 1]): P @ V of an int8 tile is (p_v @ v) * top. Dividing keeps p_v in [0, 1], where an
    fp16 operand has its full precision: p * v_s alone falls into fp16's subnormals when the
    values are small (|v| ~ 1e-3: 4-9x the error of unit values in an interpreter test). Per row
    over the keys it sees (visible: [rows or 1, N]), so that a row's arithmetic does not depend
    on keys past its position (the batch-invariant prefill: triton_invariant.py)."""
    top = tl.max(tl.where(visible, v_s[None, :], 0.0), axis=1)
    top = tl.where(top > 0, top, 1.0)  # a row that sees no key of this tile: p is 0 there
    return p * v_s[None, :] * (1.0 / top)[:, None], top[:, None]


@triton.jit
def load_v_tile(
    v_cache_ptr,
    v_rows,  # [N] kv_tile_offsets of the positions with V's strides
    pos,
    valid,
    hi,  # one past the last position of the range being read
    stride_v_dim,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    V_SLOTS_INNER: tl.constexpr,
):
    """The [N, HEAD_DIM] V tile of the positions (0 where not valid, or see below).

    V_SLOTS_INNER (kv_layout.py: each block's slots contiguous for every head and dim): each run
    of BLOCK_SIZE tokens is contiguous, which is said to the compiler, and whole blocks are read
    (a mask constant over each run), so that the load is vector and stays in shared memory for
    the P @ V product, whose reduction runs along the tokens. Slots past hi in hi's block then
    hold finite values (a zeroed cache, or writes saturated to the fp8 range), which the caller
    weights by p == 0."""
    dims = tl.arange(0, HEAD_DIM)
    offsets = v_rows[:, None] + dims[None, :] * stride_v_dim
    if V_SLOTS_INNER:
        # A tile starts on a multiple of BLOCK_N, so its runs are min(BLOCK_SIZE, BLOCK_N) long.
        RUN: tl.constexpr = BLOCK_SIZE if BLOCK_SIZE < BLOCK_N else BLOCK_N
        offsets = tl.max_contiguous(tl.multiple_of(offsets, [RUN, 1]), [RUN, 1])
        mask = pos // BLOCK_SIZE < tl.cdiv(hi, BLOCK_SIZE)
    else:
        mask = valid
    return tl.load(v_cache_ptr + offsets, mask=mask[:, None], other=0.0)


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int) -> None:
    """The kernels need a power-of-two head_dim, K rows with head_dim contiguous, and V in
    either layout of kv_layout.py (head_dim contiguous, or each block's slots contiguous)."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(
            f"the triton attention backend needs a power-of-two head_dim >= 16, got {head_dim}; "
            "use the torch backend for this model"
        )
    assert k_cache.shape == v_cache.shape and k_cache.dtype == v_cache.dtype
    assert k_cache.stride(-1) == 1 and k_cache.shape[-1] == head_dim
    assert v_cache.stride(-1) == 1 or v_cache.stride(1) == 1


def int8_scale_args(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: float | torch.Tensor,
    v_scale: float | torch.Tensor,
) -> tuple[tuple, bool]:
    """((k_scales, v_scales, block stride, slot stride), whether the cache is int8): the
    kernels' scale arguments. An int8 cache's scales are float32 [num_blocks, block_size, Hkv]
    with K's and V's strides the same and heads contiguous; other caches pass themselves as
    dummy pointers, never read (KV_INT8 off), so their kernels compile as before."""
    if not is_int8(k_cache):
        return (k_cache, v_cache, 0, 0), False
    assert isinstance(k_scale, torch.Tensor) and isinstance(v_scale, torch.Tensor)
    assert k_scale.shape == v_scale.shape == k_cache.shape[:3]
    assert k_scale.dtype == v_scale.dtype == torch.float32
    assert k_scale.stride() == v_scale.stride() and k_scale.stride(2) == 1
    return (k_scale, v_scale, k_scale.stride(0), k_scale.stride(1)), True


def output_for(out: torch.Tensor | None, q: torch.Tensor, name: str = "out") -> torch.Tensor:
    """A kernel's output shaped like q (the attention output; the rotated queries): out if given
    (checked: the kernels index it as a contiguous tensor of q's shape and dtype; `name` in the
    error), else a new one."""
    if out is None:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous {tuple(q.shape)} {q.dtype}, got {out.shape}")
    return out
