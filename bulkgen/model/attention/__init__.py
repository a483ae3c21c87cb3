"""Attention backends: `torch` (reference, CPU) and `triton` (the GPU path), each with a
batch-invariant variant (`torch-invariant`, `triton-invariant`: a row's output bit-identical
whatever its batch, chunking or step kind; torch_invariant.py, triton_invariant.py).

A backend (AttentionBackend) pairs a module's two functions, write_kv (store a step's keys and
values in the paged cache) and paged_attention (attend over it), with whether their launches
depend on static shapes only (graph_safe: the decode CUDA graphs capture them with static
DecodeGraphBuffers), and builds each step's AttnMetadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bulkgen.model.attention.metadata import AttnMetadata


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    graph_safe: bool
    # Both take a layer's k_scale and v_scale last: an fp8 cache's floats (kv_fp8.py), an int8
    # cache's [num_blocks, block_size, Hkv] scale tensors (kv_int8.py).
    # (k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, partners=None): partners, an fp8
    # cache's first-block partners (kv_pairs.py), only where there are some
    write_kv: Callable[..., None]
    # (q, k_cache, v_cache, meta, scale, k_s, v_s, out=None) -> the output (out when given)
    attend: Callable[..., torch.Tensor]
    # An 8-bit cache's values stored slots inner (kv_layout.values_slots_inner): as measured for
    # fp8 (decode_tiling.fp8_v_slots_inner), the Triton kernels only.
    fp8_v_slots_inner: bool = False
    # (q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping, k_scale, v_scale,
    # q_out=None) -> the rotated (q, k): fused_rotary's rotary and write_kv in one launch
    # (rotary_write.py), where the model's rotary is fused_rotary's (CUDA); None: the two apart.
    rotary_write_kv: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    # attend's arguments (no out) -> the output, or a decode step's as FP8 rows for an FP8
    # o_proj where the merge can write them (triton_backend.attend_fp8_rows); None: never.
    attend_fp8_rows: Callable[..., object] | None = None
    # attend (and attend_fp8_rows) take rotate=decode_rotary.Unrotated in decode-only steps: the
    # decode launch then does rotary_write_kv's work too (decode_rotary.py). Where the model's
    # rotary is fused_rotary's (CUDA), as for rotary_write_kv.
    decode_rotary: bool = False
    # Keys stored heads outer (kv_layout.keys_heads_outer: an experiment), the Triton kernels only.
    k_heads_outer: bool = False

    def metadata(
        self,
        slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        query_lens_host: list[int],
        seq_lens_host: list[int],
        kv_partners: torch.Tensor | None = None,
    ) -> AttnMetadata:
        """The step's metadata; the host lists come from the plan (the torch backend loops over
        them, the Triton one reads their maxima only), so building it never waits on the device."""
        max_query_len = max(query_lens_host)
        decode_prefix = 0
        if max_query_len > 1:  # a mixed step: count its leading one-row sequences
            while query_lens_host[decode_prefix] == 1:
                decode_prefix += 1
        return AttnMetadata(
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=block_tables,
            max_query_len=max_query_len,
            max_seq_len=max(seq_lens_host),
            decode_only=max_query_len == 1,
            query_lens_host=query_lens_host,
            seq_lens_host=seq_lens_host,
            num_decode_prefix=decode_prefix,
            kv_partners=kv_partners,
        )


def get_backend(name: str, device: torch.device, batch_invariant: bool = False) -> AttentionBackend:
    """The attention backend for this device ("auto": triton on CUDA, torch elsewhere); its
    batch-invariant variant when batch_invariant."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    suffix = "-invariant" if batch_invariant else ""
    if name == "torch":
        if batch_invariant:
            from bulkgen.model.attention import torch_invariant as m
        else:
            from bulkgen.model.attention import torch_backend as m
        return AttentionBackend(name + suffix, False, m.write_kv, m.paged_attention)
    if name == "triton":
        from bulkgen.model.attention.decode_tiling import fp8_v_slots_inner
        from bulkgen.model.attention.kv_layout import keys_heads_outer

        if batch_invariant:  # its tilings were chosen for the rows layout
            from bulkgen.model.attention import triton_invariant as m
        else:
            from bulkgen.model.attention import triton_backend as m
        slots_inner = not batch_invariant and fp8_v_slots_inner()
        from bulkgen.model.attention import rotary_write

        fused = None
        if device.type == "cuda" and not batch_invariant and rotary_write.ENABLED:
            fused = rotary_write.rotary_write_kv
        rows = None if batch_invariant else m.attend_fp8_rows
        return AttentionBackend(
            name + suffix, True, m.write_kv, m.paged_attention, slots_inner, fused, rows,
            decode_rotary=fused is not None,
            k_heads_outer=not batch_invariant and keys_heads_outer(),
        )  # fmt: skip
    raise ValueError(f"attention backend {name!r} is not one of auto, torch, triton")
