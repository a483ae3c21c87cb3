"""Attention metadata: what a forward pass needs to know about the paged KV cache.

Built by the runner for each step and passed explicitly to every attention layer (no globals).
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
