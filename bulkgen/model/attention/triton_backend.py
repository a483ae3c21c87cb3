"""Triton attention backend: the GPU fast path, a drop-in for torch_backend.

TritonAttention is graph-safe. Same two functions, same shapes and semantics as the torch
reference:
- write_kv: one program per token stores its K/V rows at their cache slots (triton_kv.py).
- paged_attention: decode-only steps (the CUDA-graph path) run the split-KV GQA decode kernel
  (triton_decode.py), whose launch depends on static shapes only; prefill and mixed steps run the
  causal varlen kernel over the paged cache (triton_prefill.py).

Neither reads host lists nor syncs with the device.
"""

from __future__ import annotations

import torch

from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.attention.triton_decode import paged_decode
from bulkgen.model.attention.triton_kv import write_kv
from bulkgen.model.attention.triton_prefill import paged_prefill

__all__ = ["TritonAttention", "paged_attention", "write_kv"]


class TritonAttention:
    name = "triton"
    graph_safe = True

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        write_kv(k, v, k_cache, v_cache, slot_mapping)

    def attend(self, q, k_cache, v_cache, meta: AttnMetadata, scale: float) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, meta, scale)

    def metadata(
        self, slot_mapping, query_start_loc, seq_lens, block_tables, query_lens_host, seq_lens_host
    ) -> AttnMetadata:
        """Host lists are read for their maxima only (they pick the prefill tile)."""
        max_query_len = max(query_lens_host)
        return AttnMetadata(
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=block_tables,
            max_query_len=max_query_len,
            max_seq_len=max(seq_lens_host),
            decode_only=max_query_len == 1,
        )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttnMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each sequence's cached context; returns [T, Hq, D].

    The cache must already hold this step's keys and values (write_kv runs first).
    """
    if meta.decode_only:
        # Never meta.max_seq_len here: the launch must not change between graph replays.
        return paged_decode(q, k_cache, v_cache, meta.seq_lens, meta.block_tables, scale)
    return paged_prefill(
        q,
        k_cache,
        v_cache,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        meta.max_query_len,
        scale,
    )
