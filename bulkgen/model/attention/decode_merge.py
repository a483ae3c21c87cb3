"""The second launch of split-KV decode (triton_decode.py): each query head's S partial
outputs, each normalised over its own run of the context, merged by their log-sum-exps (base 2):
out = sum_s 2^(lse_s - M) * out_s / sum_s 2^(lse_s - M), M = max_s lse_s. A split past the end
of a short sequence holds lse = -inf and weighs nothing."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
