"""How split-KV decode (triton_decode.py) merges each query head's S partial outputs, each
normalised over its own run of the context, by their log-sum-exps (base 2):
out = sum_s 2^(lse_s - M) * out_s / sum_s 2^(lse_s - M), M = max_s lse_s. A split past the end
of a short sequence holds lse = -inf and weighs nothing.

Two ways, the same arithmetic (merge_head) and so the same bits:
- fused (FUSED_MERGE, the default): the split kernel's programs of one (sequence, kv head) count
  themselves in after storing their partials, and the last to arrive merges the group's heads
  (merge_group_when_last), as the FP8 GEMM's fixup adds its K splits: no second launch. Measured
  on the H200: see triton_decode.py.
- merge_splits: a second launch, grid (B, Hq) (BULKGEN_DECODE_FUSED_MERGE=0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.model.fp8 import DECODE_FUSED_MERGE_ENV as FUSED_MERGE_ENV
from bulkgen.model.fp8 import switch

FUSED_MERGE = True
# Counters of the fused merge, one buffer per device that only grows: a CUDA graph captured with
# a buffer keeps its address, so the buffers it replaced stay alive (and zero between launches).
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def fused_merge() -> bool:
    """Whether split decode merges in its own launch: BULKGEN_DECODE_FUSED_MERGE, else the
    default."""
    return switch(FUSED_MERGE_ENV, FUSED_MERGE)


def merge_counters(needed: int, device: torch.device) -> torch.Tensor:
    """At least `needed` int32 counters on device, zero between launches (each fused merge
    zeroes the ones it used)."""
    buffers = _COUNTERS.setdefault(device, [])
    if not buffers or buffers[-1].numel() < needed:
        buffers.append(torch.zeros(max(4096, triton.next_power_of_2(needed)), dtype=torch.int32,
                                   device=device))  # fmt: skip
    return buffers[-1]


@triton.jit
def merge_head(part_out_ptr, part_lse_ptr, row, num_splits, SPLITS_PAD: tl.constexpr,
               HEAD_DIM: tl.constexpr):  # fmt: skip
    """Query head `row` (b * Hq + head) merged from its num_splits partials: [HEAD_DIM] float32.
    Read through L2 (.cg): in the fused merge other programs wrote them."""
    splits = tl.arange(0, SPLITS_PAD)
    split_mask = splits < num_splits
    dims = tl.arange(0, HEAD_DIM)
    lse = tl.load(
        part_lse_ptr + row * num_splits + splits,
        mask=split_mask,
        other=float("-inf"),
        cache_modifier=".cg",
    )
    parts = tl.load(
        part_out_ptr + (row * num_splits + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=split_mask[:, None],
        other=0.0,
        cache_modifier=".cg",
    )
    lse_max = tl.max(lse, axis=0)
    # All splits empty only for a padding row (seq_len 0); keep it finite: weights 0, out 0.
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp2(lse - lse_max)
    total = tl.sum(weights, axis=0)
    return tl.sum(weights[:, None] * parts, axis=0) / tl.where(total > 0, total, 1.0)


@triton.jit
def merge_group_when_last(part_out_ptr, part_lse_ptr, out_ptr, count_ptr, b, kv_head,
                          num_q_heads, num_splits, GROUP: tl.constexpr, SPLITS_PAD: tl.constexpr,
                          HEAD_DIM: tl.constexpr):  # fmt: skip
    """Called by each split program of (b, kv_head) once its partials are stored: every
    thread's stores come before the count (the barrier) and are released to the GPU with it; the
    program that counts last acquires the others', merges the group's GROUP heads into out and
    zeroes the count for the next launch (a CUDA graph replays this one)."""
    tl.debug_barrier()
    pair = b * (num_q_heads // GROUP) + kv_head
    arrived = tl.atomic_add(count_ptr + pair, 1, sem="acq_rel", scope="gpu")
    if arrived == num_splits - 1:
        dims = tl.arange(0, HEAD_DIM)
        for g in tl.static_range(GROUP):
            row = b * num_q_heads + kv_head * GROUP + g
            out = merge_head(part_out_ptr, part_lse_ptr, row, num_splits, SPLITS_PAD, HEAD_DIM)
            tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))
        tl.atomic_xchg(count_ptr + pair, 0, sem="relaxed", scope="gpu")


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
    out = merge_head(part_out_ptr, part_lse_ptr, row, NUM_SPLITS, SPLITS_PAD, HEAD_DIM)
    tl.store(out_ptr + row * HEAD_DIM + tl.arange(0, HEAD_DIM), out.to(out_ptr.dtype.element_ty))


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
