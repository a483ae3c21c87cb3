"""The decode launch's rotary and KV write (decode_rotary.py: why and when), as Triton functions
that triton_decode_kernel._decode_split_kernel calls under ROTATE."""

from __future__ import annotations

import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import FP8_MAX

_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def round_to(x, dtype: tl.constexpr, PTX: tl.constexpr):
    """x (float32) rounded to dtype, as float32. PTX: through a cvt the compiler cannot see into,
    so that the cast pair is never folded away."""
    if PTX and dtype == tl.bfloat16:
        r = tl.inline_asm_elementwise(
            "cvt.rn.bf16.f32 $0, $1;", "=h,r", [x], dtype=tl.bfloat16, is_pure=True, pack=1
        )
        return r.to(tl.float32)
    elif PTX and dtype == tl.float16:
        r = tl.inline_asm_elementwise(
            "cvt.rn.f16.f32 $0, $1;", "=h,r", [x], dtype=tl.float16, is_pure=True, pack=1
        )
        return r.to(tl.float32)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def rotate(row_ptrs, mask, pos, cos_ptr, sin_ptr, stride_cos, stride_sin, dtype: tl.constexpr,
           HEAD_DIM: tl.constexpr, PTX: tl.constexpr):  # fmt: skip
    """The heads at row_ptrs (pointers to each head's first value, [heads, 1] or scalar) rotated
    at position pos: [heads, HEAD_DIM] float32 values of dtype, fused_rotary's bits
    (rotate_half: x1 * c - x2 * s, x2 * c + x1 * s; every product and sum rounded to dtype)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    dims = tl.arange(0, HEAD_DIM)
    pair = (dims + HALF) % HEAD_DIM  # each value's partner in the other half
    c = round_to(tl.load(cos_ptr + pos * stride_cos + dims % HALF), dtype, PTX)
    s = round_to(tl.load(sin_ptr + pos * stride_sin + dims % HALF), dtype, PTX)
    x = tl.load(row_ptrs + dims, mask=mask, other=0.0).to(tl.float32)
    x_pair = tl.load(row_ptrs + pair, mask=mask, other=0.0).to(tl.float32)
    xc = round_to(x * c, dtype, PTX)
    ps = round_to(x_pair * s, dtype, PTX)
    return round_to(tl.where(dims < HALF, xc - ps, xc + ps), dtype, PTX)


@triton.jit
def write_at_its_split(
    b, kv_head, split, seq_len, tiles_per_split, pos, slot_ptr, k_new_ptr, v_new_ptr, stride_knt,
    stride_knh, stride_vnt, stride_vnh, cos_ptr, sin_ptr, stride_cos, stride_sin, k_cache_ptr,
    v_cache_ptr, k_inv_scale, v_inv_scale, stride_cache_block, stride_cache_slot,
    stride_cache_head, stride_v_block, stride_v_slot, stride_v_head, stride_v_dim,
    dtype: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    QUANTIZE: tl.constexpr, PTX: tl.constexpr,
):  # fmt: skip
    """Program (b, kv_head, split) of the decode kernel: where its split holds row b's last
    position (the new token's), and the row is not padding, the new key and value are written
    (write_new_token); then every program waits at a barrier, so that the writer's threads
    read the slot back only once all of them have stored their part."""
    writer = (tl.cdiv(seq_len, BLOCK_N) - 1) // tl.maximum(tiles_per_split, 1)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    if (split == writer) & (slot >= 0) & (seq_len > 0):
        write_new_token(
            b, kv_head, pos, slot, k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt,
            stride_vnh, cos_ptr, sin_ptr, stride_cos, stride_sin, k_cache_ptr, v_cache_ptr,
            k_inv_scale, v_inv_scale, stride_cache_block, stride_cache_slot, stride_cache_head,
            stride_v_block, stride_v_slot, stride_v_head, stride_v_dim, dtype, HEAD_DIM,
            BLOCK_SIZE, QUANTIZE, PTX,
        )  # fmt: skip
    tl.debug_barrier()


@triton.jit
def write_new_token(
    b, kv_head, pos, slot, k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh,
    cos_ptr, sin_ptr, stride_cos, stride_sin, k_cache_ptr, v_cache_ptr, k_inv_scale, v_inv_scale,
    stride_cache_block, stride_cache_slot, stride_cache_head, stride_v_block, stride_v_slot,
    stride_v_head, stride_v_dim, dtype: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, QUANTIZE: tl.constexpr, PTX: tl.constexpr,
):  # fmt: skip
    """Row b's key (rotated) and value of kv_head at its slot, as write_kv stores them."""
    dims = tl.arange(0, HEAD_DIM)
    k_row = k_new_ptr + b * stride_knt + kv_head * stride_knh
    k = rotate(k_row, True, pos, cos_ptr, sin_ptr, stride_cos, stride_sin, dtype, HEAD_DIM, PTX)
    v = tl.load(v_new_ptr + b * stride_vnt + kv_head * stride_vnh + dims).to(tl.float32)
    if QUANTIZE:  # write_token's fp8 arithmetic
        k = tl.clamp(k * k_inv_scale, -_FP8_MAX, _FP8_MAX)
        v = tl.clamp(v * v_inv_scale, -_FP8_MAX, _FP8_MAX)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    k_at = block * stride_cache_block + offset * stride_cache_slot + kv_head * stride_cache_head
    v_at = block * stride_v_block + offset * stride_v_slot + kv_head * stride_v_head
    tl.store(k_cache_ptr + k_at + dims, k.to(k_cache_ptr.dtype.element_ty))
    tl.store(v_cache_ptr + v_at + dims * stride_v_dim, v.to(v_cache_ptr.dtype.element_ty))
