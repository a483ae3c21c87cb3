"""Batch-invariant Triton attention: one kernel, one tiling, for every step (`--batch-invariant`).

A query row's output must be bit-identical whatever the step it is computed in: decoded alone, in
a batch of 256, padded to a CUDA-graph bucket, prefilled whole, in chunks (chunked prefill, or a
prefix-cache hit: the query starts later), or recomputed after preemption. The default backend
breaks that three ways: decode steps run the split-KV kernel whose split count follows the batch
size (a row's context is cut into a different number of partial softmaxes, merged in another
order); prefill tiles grow with max_query_len (16 or 64 rows, so a row's dot products and row
reductions run in another MMA shape); and the prefill kernel sends a tile's K/V blocks through
an unmasked loop up to its first query position, masked after it, two code paths whose
instructions differ (the compiler may fuse the softmax scale into exp2's argument in one and not
the other behind a select).

Here every step (decode-only included, so also inside the decode CUDA graphs) runs the varlen
prefill kernel of triton_prefill.py with:
- one tiling: BLOCK_M = 16 rows (max(16, next_pow2(GROUP)) for larger groups), BLOCK_Q =
  BLOCK_M // GROUP query positions, BLOCK_N = 64 keys (32 for head_dim > 128), num_warps = 4,
  the decode-like tile the default kernel already uses for short queries (invariant_tiles);
- no split-K: one program streams a row's whole context, K/V tiles aligned at multiples of
  BLOCK_N from position 0, so a row at position p always meets tiles [0, BLOCK_N), [BLOCK_N,
  2 BLOCK_N), ... in that order, each through the same masked loop body (INVARIANT: the
  unmasked loop is never used);
- each output element's dot products (over head_dim, then over a tile's BLOCK_N keys) and each
  row's max and sum run in the fixed MMA/reduction shape of that tiling: a row's arithmetic does
  not depend on the other rows of its tile nor on its place in it (the same premise as the
  batch-invariant GEMMs: a fixed tile shape, every element reduced in one fixed order).

Why what differs from step to step adds exact zeros. What changes with the step is which tiles a
row visits past its own position (a query tile runs up to its last row's position, so a tile that
straddles a multiple of BLOCK_N, as chunks starting off a multiple of BLOCK_Q make, visits one
K/V tile more), and, inside its last tile, whether the keys after p are real (later rows of a
prefill) or absent (decode: loaded as 0). Either way they are masked to s = -inf. Online softmax
in base 2 with m, l, acc:
- a fully masked tile: max(s) = -inf, so m_new = m (finite: position 0 is in every row's first
  tile and never masked); alpha = exp2(m - m_new) = exp2(0) = 1 exactly (PTX's ex2.approx maps
  +-0 to 1 and -inf to +0); p = exp2(-inf) = 0; l*1 + 0 = l and acc*1 + p @ v = acc + 0 = acc.
  m, l and acc are unchanged, bit for bit.
- a partially masked tile: the masked entries have p = 0 exactly; their max is -inf, which never
  wins; in the row sum and in p @ v they add 0 * v = +-0 (v finite: every position < the tile's
  end was written this step or before, and absent ones load as 0), which leaves any nonzero sum
  unchanged (only an exactly zero accumulator could turn -0 into +0, which compare equal).
Tiles never span sequences, so padding rows (a graph bucket's spare rows, seq_len 1 on a stale
block) cannot touch real rows.

Graph-safe: the grid (T // BLOCK_Q + B, Hkv) comes from static shapes and no host length is read
(max_query_len is not used), so DecodeGraphBuffers' query_start_loc = arange(bucket + 1) serves
as is. An fp8 cache works as in the prefill kernel (cast on load, scales folded out of the loop).

Cost against the default decode kernel, per (sequence, kv-head): the same tile (16 rows x 64
keys; on sm_90 both compile to mma.sync m16n8k16 with the same MMA and ex2 count per K/V tile)
and the same K/V bytes, read once. The split kernel adds splits only while batch x Hkv < 2 x SMs
(the H200's 132 SMs and the 8B shape's 8 kv-heads: batch <= 32); above that it runs unsplit and
the work is the same. Below it, the split kernel spreads long contexts over up to 64 programs per
(sequence, kv-head) and this kernel does not: small batches of long contexts leave SMs idle. The
grid also holds B // BLOCK_Q empty programs (a binary search, then exit). Prefill runs 16-row
tiles instead of the default's 64 (wgmma m64 on sm_90): each K/V tile is loaded for 4x fewer
query rows (4x the L2 traffic), the MMAs are smaller, and the causal mask is applied to every
tile; prefill attention is a small part of a prefill step next to its GEMMs.
"""

from __future__ import annotations

import torch

from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.attention.triton_kv_write import write_kv
from bulkgen.model.attention.triton_prefill import paged_prefill

__all__ = ["paged_attention", "write_kv"]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttnMetadata,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each sequence's cached context; returns [T, Hq, D]
    (into `out` when given), each row computed the same way whatever the step (decode, prefill,
    chunk, batch, padding)."""
    return paged_prefill(
        q,
        k_cache,
        v_cache,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        meta.max_query_len,  # unused by the invariant tiling
        scale,
        k_scale,
        v_scale,
        invariant=True,
        out=out,
        partners=meta.kv_partners,
    )
