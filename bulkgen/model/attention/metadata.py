"""Attention metadata: what a forward pass needs to know about the paged KV cache.

Built by the attention backend for each step (AttentionBackend.metadata) and passed explicitly to
every attention layer (no globals).
A step's tokens are flattened: sequence b owns query rows query_start_loc[b]:query_start_loc[b+1],
which are the last query_len tokens of its seq_lens[b] tokens of context. Query row i of b sits at
absolute position seq_lens[b] - query_len_b + i and attends causally to positions <= its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttnMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot (block * block_size + offset); < 0 = skip
    query_start_loc: torch.Tensor  # [B + 1] int32, on the device
    seq_lens: torch.Tensor  # [B] int32: context length including this step's tokens
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32, unused entries arbitrary
    max_query_len: int  # host-side bounds (known to the scheduler, never read from the device)
    max_seq_len: int
    decode_only: bool  # every sequence has exactly one query row (CUDA-graph decode steps)
    # Host copies of the per-sequence lengths for the torch backend's per-sequence loop. They come
    # from the scheduler's plan, so reading them never waits on the device. None in graphs.
    query_lens_host: list[int] | None = None
    seq_lens_host: list[int] | None = None
    # How many sequences at the front of a mixed step have one query row (the scheduler puts the
    # running requests first, so these are its decoding rows): the Triton backend may run them
    # through the decode kernel (triton_backend.SPLIT_MIXED_MIN_ROWS). 0 in decode-only steps.
    num_decode_prefix: int = 0
    # The Triton backend's metadata of the prefill chunks after a split (triton_backend.py),
    # built at the first layer of the step and reused by the others.
    prefill_part: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # An fp8 cache's first-block partners (kv_pairs.py): [num_blocks] int32, the block holding
    # block i's low part or -1; the same device table every step (graphs capture it). None: none.
    kv_partners: torch.Tensor | None = None


class DecodeGraphBuffers:
    """Static metadata tensors of the decode CUDA graphs: one set sized for the largest bucket,
    sliced per bucket at capture and refilled (with padding rows) before each replay."""

    def __init__(
        self,
        max_seqs: int,
        width: int,
        device: torch.device,
        kv_partners: torch.Tensor | None = None,
    ) -> None:
        self.kv_partners = kv_partners
        self.slot_mapping = torch.full((max_seqs,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_seqs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_seqs, width, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_seqs + 1, dtype=torch.int32, device=device)

    def view(self, bucket: int) -> AttnMetadata:
        return AttnMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            query_start_loc=self.query_start_loc[: bucket + 1],
            seq_lens=self.seq_lens[:bucket],
            block_tables=self.block_tables[:bucket],
            max_query_len=1,
            max_seq_len=0,  # unused by graph-safe decode attention
            decode_only=True,
            kv_partners=self.kv_partners,
        )
