"""Reference attention over the paged KV cache in plain torch.

The CPU path and the correctness oracle for the Triton kernels. Loops over sequences (never over
tokens) using host-side lengths from the plan, so it never syncs with the device.
"""

from __future__ import annotations

import torch

from bulkgen.model.attention.metadata import AttnMetadata


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store this step's keys/values [T, Hkv, D] at their slots of the [N, bs, Hkv, D] caches."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v[keep].to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttnMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each sequence's cached context; returns [T, Hq, D].

    Computed in float32 whatever the cache dtype.
    """
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    q_lens, seq_lens = meta.query_lens_host, meta.seq_lens_host
    if q_lens is None or seq_lens is None:
        raise ValueError("the torch attention backend needs host-side lengths in AttnMetadata")
    out = torch.empty_like(q)
    start = 0
    for b, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
        num_blocks = -(-seq_len // block_size)
        blocks = meta.block_tables[b, :num_blocks].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        qb = q[start : start + q_len].float().view(q_len, num_kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,khd->hgqk", qb, k) * scale  # [Hkv, G, q_len, seq_len]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        scores.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        ob = torch.einsum("hgqk,khd->qhgd", probs, v).reshape(q_len, num_q_heads, head_dim)
        out[start : start + q_len] = ob.to(q.dtype)
        start += q_len
    return out
