"""Attention backends: `torch` (reference, CPU) and `triton` (the GPU path).

A backend is an object with the same small interface (AttentionBackend): it stores a step's keys
and values in the paged cache, attends over it, builds the step's AttnMetadata, and says whether
its launches depend on static shapes only (graph_safe), in which case the decode CUDA graphs
capture it with static DecodeGraphBuffers.
"""

from __future__ import annotations

from typing import Protocol

import torch

from bulkgen.model.attention.metadata import AttnMetadata


class AttentionBackend(Protocol):
    name: str
    graph_safe: bool  # launches depend on static shapes only: decode steps can be captured

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttnMetadata,
        scale: float,
    ) -> torch.Tensor: ...

    def metadata(
        self,
        slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        query_lens_host: list[int],
        seq_lens_host: list[int],
    ) -> AttnMetadata: ...


def get_backend(name: str, device: torch.device) -> AttentionBackend:
    """The attention backend for this device ("auto": triton on CUDA, torch elsewhere)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        from bulkgen.model.attention.torch_backend import TorchAttention

        return TorchAttention()
    if name == "triton":
        from bulkgen.model.attention.triton_backend import TritonAttention

        return TritonAttention()
    raise ValueError(f"attention backend {name!r} is not one of torch, triton")
