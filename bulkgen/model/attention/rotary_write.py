"""Rotary embedding of q and k and the KV-cache write in one Triton launch (the Triton backend on
CUDA, where the model's rotary is fused_rotary's; ENABLED).

Program t rotates token t's query and key heads as fused_rotary._rotary_kernel does (the same
function, rotate_token, with the same roundings: FP fusion off for the launch), stores them as new
contiguous tensors, and after a barrier (its threads read back what others wrote) writes the
rotated keys and the values into the caches as triton_kv_write._write_kv_kernel does (the same
function, write_token: fp8 scaling, int8 quantization, either value layout). One launch a layer
instead of two: in the blog FP8 profile on the H200 (aa3e041, 32 rows) the rotary and write
launches took 2.2 and 1.9 us each, plus the gap between every two kernels of a graph. Outputs
are bit-identical to the two launches (tests/test_rotary_write.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.attention.kv_fp8 import is_fp8
from bulkgen.model.attention.triton_kv import check_cache, int8_scale_args, output_for
from bulkgen.model.attention.triton_kv_runs import runs_apply, write_v_runs
from bulkgen.model.attention.triton_kv_write import write_token
from bulkgen.model.fused_rotary import rotate_token

# On since d5d0ec5: tests/test_rotary_write.py's GPU test (the engine's greedy tokens with and
# without it) passed on the H200, and blog ran 4,980 tok/s against 4,961 in bf16, 6,170 against
# 6,140 in FP8 (the same call; within run-to-run noise, not worse).
ENABLED = True


@triton.jit
def _rotary_write_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_sin,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_v_dim,
    k_inv_scale,
    v_inv_scale,
    k_scales_ptr,
    v_scales_ptr,
    stride_scale_block,
    stride_scale_slot,
    partners_ptr,
    Q_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QUANTIZE: tl.constexpr,
    KV_INT8: tl.constexpr,
    PAIRS: tl.constexpr,
    WRITE_V: tl.constexpr,  # False: triton_kv_runs.write_v_runs stores the values after
):
    t = tl.program_id(0).to(tl.int64)
    rotate_token(
        t, q_ptr, k_ptr, positions_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, stride_sin,
        Q_HEADS, Q_HEADS_PAD, K_HEADS, K_HEADS_PAD, HALF, HALF_PAD,
    )  # fmt: skip
    tl.debug_barrier()  # the rotated keys, stored by every thread, are read back below
    write_token(
        t, k_out_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        K_HEADS * 2 * HALF, 2 * HALF, stride_vt, stride_vh,
        stride_cache_block, stride_cache_slot, stride_cache_head,
        stride_v_block, stride_v_slot, stride_v_head, stride_v_dim,
        K_HEADS, k_inv_scale, v_inv_scale,
        k_scales_ptr, v_scales_ptr, stride_scale_block, stride_scale_slot, partners_ptr,
        BLOCK_SIZE, K_HEADS_PAD, 2 * HALF, QUANTIZE, KV_INT8, PAIRS, WRITE_V,
    )  # fmt: skip


def rotary_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    q_out: torch.Tensor | None = None,
    partners: torch.Tensor | None = None,
    v_runs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fused_rotary.rotary(q, k, ...) and triton_kv_write.write_kv(rotated k, v, ...) in one launch;
    the rotated (q, k) as new contiguous tensors, q in q_out when given (contiguous, q's shape
    and dtype: a static buffer of engine/mixed_graphs.py's pieces); partners: write_kv's.
    v_runs (a step with prefill): where triton_kv_runs.runs_apply, the values are stored by
    write_v_runs, a second launch, the same bits."""
    T, q_heads, head_dim = q.shape
    k_heads, half = k.shape[1], head_dim // 2
    assert k.shape == v.shape == (T, k_heads, head_dim) and k.dtype == q.dtype == v.dtype
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1, "head_dim must be contiguous"
    assert cos.shape[-1] == half and sin.shape == cos.shape and positions.shape == (T,)
    check_cache(k_cache, v_cache, head_dim)
    q_out = output_for(q_out, q, "q_out")
    k_out = torch.empty((T, k_heads, head_dim), dtype=k.dtype, device=k.device)
    if T == 0:
        return q_out, k_out
    scale_args, int8 = int8_scale_args(k_cache, v_cache, k_scale, v_scale)
    q_heads_pad, k_heads_pad = triton.next_power_of_2(q_heads), triton.next_power_of_2(k_heads)
    half_pad = triton.next_power_of_2(half)
    tile = (q_heads_pad + k_heads_pad) * half_pad * 2  # elements a program rotates
    runs = v_runs and runs_apply(v_cache, partners)
    _rotary_write_kv_kernel[(T,)](
        q, k, v, positions, cos, sin, q_out, k_out, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *v_cache.stride(),
        1.0 if int8 else 1.0 / k_scale,
        1.0 if int8 else 1.0 / v_scale,
        *scale_args, slot_mapping if partners is None else partners,
        Q_HEADS=q_heads, Q_HEADS_PAD=q_heads_pad, K_HEADS=k_heads, K_HEADS_PAD=k_heads_pad,
        HALF=half, HALF_PAD=half_pad, BLOCK_SIZE=k_cache.shape[1],
        QUANTIZE=is_fp8(k_cache), KV_INT8=int8, PAIRS=partners is not None and is_fp8(k_cache),
        WRITE_V=not runs,
        num_warps=min(8, triton.next_power_of_2(max(1, tile // 1024))),  # the rotary's
        enable_fp_fusion=False,  # fused_rotary._rotate_heads' roundings
    )  # fmt: skip
    if runs:
        write_v_runs(v, v_cache, slot_mapping, v_scale)
    return q_out, k_out
