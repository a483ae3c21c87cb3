"""The second launch of split-KV decode (triton_decode.py): each query head's S partial
outputs, each normalised over its own run of the context, merged by their log-sum-exps (base 2):
out = sum_s 2^(lse_s - M) * out_s / sum_s 2^(lse_s - M), M = max_s lse_s. A split past the end
of a short sequence holds lse = -inf and weighs nothing.

merge_splits_to_fp8 merges all of a sequence's heads in one program and writes o_proj's input
as FP8 rows with their scales (unless BULKGEN_FP8_ATTN_ROWS=0): the value of
every head rounded to the model's dtype as merge_splits writes it, then quantized as
fp8_kernels.quantize_rows quantizes that row, so the FP8 projection's own quantizer launch goes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.fp8 import FP8
from bulkgen.model.fp8_kernels import hw_rounding, quantize_value, row_scale


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    row = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)  # b * Hq + head
    splits = tl.arange(0, SPLITS_PAD)
    split_mask = splits < NUM_SPLITS
    dims = tl.arange(0, HEAD_DIM)
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + splits, mask=split_mask, other=float("-inf"))
    parts = tl.load(
        part_out_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=split_mask[:, None],
        other=0.0,
    )
    lse_max = tl.max(lse, axis=0)
    # All splits empty only for a padding row (seq_len 0); keep it finite: weights 0, out 0.
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp2(lse - lse_max)
    total = tl.sum(weights, axis=0)
    out = tl.sum(weights[:, None] * parts, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """out [B, Hq, D] from part_out [B, Hq, S, D] (float32) and part_lse [B, Hq, S]."""
    batch, num_q_heads, num_splits, head_dim = part_out.shape
    _decode_reduce_kernel[(batch, num_q_heads)](
        part_out,
        part_lse,
        out,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        num_warps=4,
    )


@triton.jit
def _decode_reduce_rows_kernel(
    part_out_ptr,
    part_lse_ptr,
    q_ptr,  # fp8 [B, HEADS * HEAD_DIM]
    scale_ptr,  # float32 [B]
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DTYPE: tl.constexpr,  # the attention output's (the model's) dtype
    HW_ROUND: tl.constexpr,  # fp8_kernels.HW_ROUNDING
):
    """_decode_reduce_kernel's merge for every head of one sequence, then its row quantized."""
    b = tl.program_id(0)
    heads, splits, dims = tl.arange(0, HEADS_PAD), tl.arange(0, SPLITS_PAD), tl.arange(0, HEAD_DIM)
    head_ok = heads < HEADS
    mask = head_ok[:, None] & (splits < NUM_SPLITS)[None, :]
    at = (b * HEADS + heads)[:, None] * NUM_SPLITS + splits[None, :]  # [HEADS_PAD, SPLITS_PAD]
    lse = tl.load(part_lse_ptr + at, mask=mask, other=float("-inf"))
    parts = tl.load(
        part_out_ptr + at[:, :, None] * HEAD_DIM + dims[None, None, :],
        mask=mask[:, :, None],
        other=0.0,
    )
    lse_max = tl.max(lse, axis=1)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # a padding row: out 0
    weights = tl.exp2(lse - lse_max[:, None])
    total = tl.sum(weights, axis=1)
    out = tl.sum(weights[:, :, None] * parts, axis=1) / tl.where(total > 0, total, 1.0)[:, None]
    out = tl.where(head_ok[:, None], out.to(DTYPE).to(tl.float32), 0.0)
    scale = row_scale(tl.max(tl.max(tl.abs(out), axis=1), axis=0))
    q = quantize_value(out, scale, HW_ROUND)
    cols = heads[:, None] * HEAD_DIM + dims[None, :]
    tl.store(
        q_ptr + b * HEADS * HEAD_DIM + cols, q.to(q_ptr.dtype.element_ty), mask=head_ok[:, None]
    )
    tl.store(scale_ptr + b, scale)


def merge_splits_to_fp8(
    part_out: torch.Tensor, part_lse: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 rows [B, Hq * D], their scales [B, 1]) of what merge_splits would write in dtype,
    quantized per row as fp8_kernels.quantize_rows does."""
    batch, num_q_heads, num_splits, head_dim = part_out.shape
    q = torch.empty((batch, num_q_heads * head_dim), dtype=FP8, device=part_out.device)
    scale = torch.empty((batch, 1), dtype=torch.float32, device=part_out.device)
    if batch:
        _decode_reduce_rows_kernel[(batch,)](
            part_out,
            part_lse,
            q,
            scale,
            NUM_SPLITS=num_splits,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            HEAD_DIM=head_dim,
            HEADS=num_q_heads,
            HEADS_PAD=triton.next_power_of_2(num_q_heads),
            DTYPE=getattr(tl, str(dtype).removeprefix("torch.")),
            HW_ROUND=hw_rounding(part_out.device),
            num_warps=8,
        )
    return q, scale
