"""The log-sum-exp of each logits row in Triton, computed the same way whatever the batch.

Logprobs are logits minus the row's log-sum-exp. torch's CUDA reductions pick their block shape,
and how many CTAs share one output, from the number of outputs (ATen's Reduce.cuh: block_height
from last_pow2(num_outputs), ctas_per_output from the grid), so logits.logsumexp(-1) sums a row's
exponentials in an order that follows the batch size. Here one program per row streams the row in
BLOCK-sized chunks, in the same order whatever the batch: per-lane maxima, then per-lane sums of
exp2((x - M) * log2 e), each reduced once at the end in the fixed tree of a fixed layout
(BLOCK, NUM_WARPS); lse = M + ln(sum). Used by `--batch-invariant` (sampler.row_logsumexp).
Two reads of the row (about 1 MB per row of a 128256-token vocabulary), no host sync, a grid of
static shape: safe inside a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # tokens per chunk
NUM_WARPS = 8
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _logsumexp_kernel(logits_ptr, stride_row, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    logits_ptr += row.to(tl.int64) * stride_row
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(logits_ptr + start + offs, mask=start + offs < V, other=float("-inf"))
        best = tl.maximum(best, x)
    m = tl.max(best, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # a row of -inf: sum 0, lse -inf (not NaN)
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(logits_ptr + start + offs, mask=start + offs < V, other=float("-inf"))
        total += tl.exp2((x - m) * _LOG2E)
    tl.store(out_ptr + row, m + tl.log(tl.sum(total, axis=0)))


def logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(logits), -1)) [B] float32 for float32 logits [B, V] with unit column stride."""
    b, v = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1, "float32 rows, unit stride"
    out = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b == 0:
        return out
    _logsumexp_kernel[(b,)](logits, logits.stride(0), out, v, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
