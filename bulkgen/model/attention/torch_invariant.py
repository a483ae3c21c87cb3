"""Batch-invariant attention in plain torch: the CPU path of `--batch-invariant`.

torch_backend pads decode rows to the batch's longest context and computes a prefill with einsums
over the whole sequence: the length, the shapes and so the BLAS blocking of each reduction follow
the batch. Here every query token is computed on its own, from tensors whose shapes, strides and
alignment depend only on its position p:
- q: the token's [Hkv, G, D] heads, copied into a fresh (64-byte aligned) float32 buffer;
- K, V: the first p + 1 cached positions, a prefix (offset 0, strides fixed by Hkv and D) of the
  sequence's gathered context, a fresh buffer;
- scores = q @ K^T over exactly those p + 1 keys, softmax over exactly those, out = probs @ V over
  exactly those (batched over kv-heads: heads are matrices of the batched matmul, never summed
  together).
The same position with the same cached K/V therefore runs the same operations on the same shapes
whether it is prefilled whole, in chunks, after a prefix-cache hit, recomputed after preemption,
or decoded alone or beside other sequences (padded or not): bit for bit the same output.
Slower than torch_backend (a few small matmuls per token and layer), which is fine for the tiny
models the CPU runs. An fp8 or int8 cache is dequantized on read as in torch_backend (the whole
context at once, elementwise: a position's values do not depend on the others).
"""

from __future__ import annotations

import torch

from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.attention.torch_backend import Scale, _read, write_kv

__all__ = ["paged_attention", "write_kv"]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttnMetadata,
    scale: float,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each sequence's cached context; returns [T, Hq, D]
    (written into `out` when given: a [T, Hq, D] tensor of q's dtype).

    Computed in float32 whatever the cache dtype, one query token at a time.
    """
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    q_lens, seq_lens = meta.query_lens_host, meta.seq_lens_host
    if q_lens is None or seq_lens is None:
        raise ValueError("the torch attention backend needs host-side lengths in AttnMetadata")
    out = torch.empty_like(q) if out is None else out
    start = 0
    for b, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
        blocks = meta.block_tables[b, : -(-seq_len // block_size)].long()
        # Fresh gathers: position 0 at offset 0, so a prefix view of them depends on p alone.
        k = _read(k_cache, blocks, k_scale, meta.kv_partners).reshape(-1, num_kv_heads, head_dim)
        v = _read(v_cache, blocks, v_scale, meta.kv_partners).reshape(-1, num_kv_heads, head_dim)
        for i in range(q_len):
            pos = seq_len - q_len + i
            row = q[start + i].to(torch.float32, copy=True).view(num_kv_heads, group, head_dim)
            keys = k[: pos + 1].transpose(0, 1)  # [Hkv, pos + 1, D]
            values = v[: pos + 1].transpose(0, 1)
            probs = (torch.matmul(row, keys.transpose(1, 2)) * scale).softmax(dim=-1)
            out[start + i] = torch.matmul(probs, values).view(num_q_heads, head_dim).to(q.dtype)
        start += q_len
    return out
