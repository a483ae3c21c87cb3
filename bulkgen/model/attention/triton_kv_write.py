"""Storing new keys and values in the paged KV cache (Triton).

write_kv: grid (T,). Program t copies token t's keys and values ([Hkv, D] each) to slot
slot_mapping[t] of the caches, converting to the cache dtype; slots < 0 (the padding rows of a
CUDA-graph batch) are skipped. Slot s lives at block s // block_size, offset s % block_size.
An fp8 cache (kv_fp8.py) stores clamp(x * (1 / scale), -448, 448) rounded to e4m3, as
kv_fp8.quantize does; an int8 cache (kv_int8.py) stores each head's row divided by its
max|x| / 127 and rounded to even, and that scale at the slot of its scale tensor, bit for bit as
kv_int8.quantize does; other caches compile the plain cast only. write_token is one program's
work, which rotary_write.py's fused launch runs too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import FP8_MAX, is_fp8
from bulkgen.model.attention.kv_int8 import INT8_MAX
from bulkgen.model.attention.triton_kv import check_cache, int8_scale_args
from bulkgen.model.attention.triton_kv_pairs import split_pair

_FP8_MAX = tl.constexpr(FP8_MAX)
_INT8_MAX = tl.constexpr(INT8_MAX)
_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2**23: (y + _ROUND) - _ROUND rounds |y| < 2**22 to even


@triton.jit
def _quantize_int8_rows(x, scales_ptr, scale_offsets, mask):
    """x [HEADS_PAD, HEAD_DIM] as int8 rows; each row's scale max|x| / 127 (1 for a zero row)
    stored at scales_ptr + scale_offsets. div_rn: Triton's "/" is approximate on the GPU, and
    torch divides with IEEE rounding."""
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, _INT8_MAX), 1.0)
    tl.store(scales_ptr + scale_offsets, scale, mask=mask)
    y = tl.math.div_rn(x, scale[:, None])
    return tl.clamp((y + _ROUND) - _ROUND, -_INT8_MAX, _INT8_MAX)


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_v_block,  # V's own strides: its layout may differ from K's (kv_layout.py)
    stride_v_slot,
    stride_v_head,
    stride_v_dim,
    num_kv_heads,
    k_inv_scale,
    v_inv_scale,
    k_scales_ptr,  # an int8 cache's scales [num_blocks, block_size, Hkv] (else unused)
    v_scales_ptr,
    stride_scale_block,
    stride_scale_slot,
    partners_ptr,  # an fp8 cache's first-block partners (kv_pairs.py; else unused)
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QUANTIZE: tl.constexpr,  # an fp8 cache: scale and saturate before the cast
    KV_INT8: tl.constexpr,  # an int8 cache: a scale per head row, stored beside it
    PAIRS: tl.constexpr,  # the low part of a first block's values to its partner
):
    write_token(
        tl.program_id(0), k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        stride_kt, stride_kh, stride_vt, stride_vh,
        stride_cache_block, stride_cache_slot, stride_cache_head,
        stride_v_block, stride_v_slot, stride_v_head, stride_v_dim,
        num_kv_heads, k_inv_scale, v_inv_scale,
        k_scales_ptr, v_scales_ptr, stride_scale_block, stride_scale_slot, partners_ptr,
        BLOCK_SIZE, HEADS_PAD, HEAD_DIM, QUANTIZE, KV_INT8, PAIRS,
    )  # fmt: skip


@triton.jit
def write_token(
    t,
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_v_dim,
    num_kv_heads,
    k_inv_scale,
    v_inv_scale,
    k_scales_ptr,
    v_scales_ptr,
    stride_scale_block,
    stride_scale_slot,
    partners_ptr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QUANTIZE: tl.constexpr,
    KV_INT8: tl.constexpr,
    PAIRS: tl.constexpr,
    WRITE_V: tl.constexpr = True,  # False: the keys only (rotary_write's v_runs stores values)
):
    """Token t's keys and values into the caches (_write_kv_kernel's arguments)."""
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:  # a padding row of a CUDA-graph batch has slot -1
        heads = tl.arange(0, HEADS_PAD)[:, None]
        dims = tl.arange(0, HEAD_DIM)[None, :]
        mask = heads < num_kv_heads
        block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        dst = block * stride_cache_block + offset * stride_cache_slot
        dst += heads * stride_cache_head + dims
        dst_v = block * stride_v_block + offset * stride_v_slot + heads * stride_v_head
        dst_v += dims * stride_v_dim
        k = tl.load(k_ptr + t * stride_kt + heads * stride_kh + dims, mask=mask)
        v = tl.load(v_ptr + t * stride_vt + heads * stride_vh + dims, mask=mask)
        if QUANTIZE:
            k = tl.clamp(k.to(tl.float32) * k_inv_scale, -_FP8_MAX, _FP8_MAX)
            v = tl.clamp(v.to(tl.float32) * v_inv_scale, -_FP8_MAX, _FP8_MAX)
        if KV_INT8:
            scale_at = block * stride_scale_block + offset * stride_scale_slot
            scale_at += tl.arange(0, HEADS_PAD)
            head_mask = tl.arange(0, HEADS_PAD) < num_kv_heads
            k = _quantize_int8_rows(k, k_scales_ptr, scale_at, head_mask)
            v = _quantize_int8_rows(v, v_scales_ptr, scale_at, head_mask)
        if PAIRS:  # a first block's token: its low parts at the same slot of the partner
            lo_block = tl.load(partners_ptr + block).to(tl.int64)
            if lo_block >= 0:
                k, k_lo = split_pair(k)
                v, v_lo = split_pair(v)
                shift = (lo_block - block) * stride_cache_block
                tl.store(
                    k_cache_ptr + dst + shift, k_lo.to(k_cache_ptr.dtype.element_ty), mask=mask
                )
                shift_v = (lo_block - block) * stride_v_block
                lo_v = v_lo.to(v_cache_ptr.dtype.element_ty)
                tl.store(v_cache_ptr + dst_v + shift_v, lo_v, mask=mask)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        if WRITE_V:
            tl.store(v_cache_ptr + dst_v, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    partners: torch.Tensor | None = None,
) -> None:
    """Store this step's keys/values [T, Hkv, D] at their slots of the [N, bs, Hkv, D] caches
    (an fp8 cache stores x / scale; an int8 cache's scales are its [N, bs, Hkv] scale tensors,
    written here; the scales are ignored by other caches; V's storage may be either layout of
    kv_layout.py). partners: an fp8 cache's first-block partners [N] (kv_pairs.py)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    check_cache(k_cache, v_cache, head_dim)
    if num_tokens == 0:
        return
    # Rows may be strided (views into a fused QKV output); head_dim must be contiguous.
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    scale_args, int8 = int8_scale_args(k_cache, v_cache, k_scale, v_scale)
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        *v_cache.stride(),
        num_kv_heads,
        1.0 if int8 else 1.0 / k_scale,
        1.0 if int8 else 1.0 / v_scale,
        *scale_args,
        slot_mapping if partners is None else partners,
        BLOCK_SIZE=k_cache.shape[1],
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        QUANTIZE=is_fp8(k_cache),
        KV_INT8=int8,
        PAIRS=partners is not None and is_fp8(k_cache),
        num_warps=4,
    )
