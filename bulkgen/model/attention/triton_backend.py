"""Triton attention backend: the GPU fast path, a drop-in for torch_backend.

Graph-safe. Same two functions, same shapes and semantics as the torch
reference:
- write_kv: one program per token stores its K/V rows at their cache slots (triton_kv_write.py).
- paged_attention: decode-only steps (the CUDA-graph path) run the split-KV GQA decode kernel
  (triton_decode.py), whose launch depends on static shapes only; prefill and mixed steps run the
  causal varlen kernel over the paged cache (triton_prefill.py). A mixed step's leading one-row
  sequences (its decoding requests: meta.num_decode_prefix), when SPLIT_MIXED_MIN_ROWS or more,
  take the decode kernel instead, into the front rows of the same output, and only the rest the
  varlen kernel.

Neither reads host lists nor syncs with the device.
"""

from __future__ import annotations

import functools

import torch

from bulkgen.model.attention.decode_rotary import Unrotated
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.attention.triton_decode import paged_decode
from bulkgen.model.attention.triton_kv_write import write_kv
from bulkgen.model.attention.triton_prefill import paged_prefill

__all__ = ["paged_attention", "write_kv"]

# A mixed step of at least this many decoding rows splits (None: never). In a mixed step the
# varlen kernel gives each decoding row a query tile of its own (BLOCK_M rows for its GROUP heads)
# and walks its whole context in one program, where the decode kernel splits long contexts over
# several. Measured on the H200 (scripts/bench_attention.py --mixed at b5209a1, bf16 cache,
# 1,500-token contexts beside a 1,536-token chunk): the split takes 0.892x the varlen kernel's
# speed at 16 rows, 0.94x at 64, 1.065x at 256 and 1.102x at 448; the crossing lies near 160.
SPLIT_MIXED_MIN_ROWS: int | None = 160


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttnMetadata,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    fp8_rows: bool = False,
    rotate: Unrotated | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over each sequence's cached context; returns [T, Hq, D]
    (written into `out` when given: the static buffer of engine/mixed_graphs.py's pieces), or
    with fp8_rows a split decode step's FP8 rows (attend_fp8_rows below).

    The cache must already hold this step's keys and values (write_kv runs first); k_scale and
    v_scale dequantize an fp8 cache, meta.kv_partners its paired first blocks (kv_pairs.py).
    rotate (decode-only steps): q is unrotated and the decode launch rotates it and writes the
    step's keys and values instead (decode_rotary.py).
    """
    assert rotate is None or meta.decode_only
    if meta.decode_only:
        # Never meta.max_seq_len here: the launch must not change between graph replays.
        return paged_decode(
            q,
            k_cache,
            v_cache,
            meta.seq_lens,
            meta.block_tables,
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
            out=out,
            partners=meta.kv_partners,
            fp8_rows=fp8_rows,
            rotate=rotate,
        )
    split = meta.num_decode_prefix
    if SPLIT_MIXED_MIN_ROWS is None or split < SPLIT_MIXED_MIN_ROWS:
        split = 0
    if split and out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if split:
        paged_decode(
            q[:split],
            k_cache,
            v_cache,
            meta.seq_lens[:split],
            meta.block_tables[:split],
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
            out=out[:split],
            partners=meta.kv_partners,
        )
    query_start_loc, seq_lens, block_tables = (
        prefill_part(meta, split)
        if split
        else (meta.query_start_loc, meta.seq_lens, meta.block_tables)
    )
    prefill = paged_prefill(
        q[split:],
        k_cache,
        v_cache,
        query_start_loc,
        seq_lens,
        block_tables,
        meta.max_query_len,
        scale,
        k_scale,
        v_scale,
        out=out[split:] if out is not None else None,
        partners=meta.kv_partners,
    )
    return out if out is not None else prefill


# The backend's attend_fp8_rows: a decode-only step whose contexts are split returns its output
# as FP8 rows for an FP8 o_proj (triton_decode.paged_decode's fp8_rows: an Fp8Activation).
attend_fp8_rows = functools.partial(paged_attention, fp8_rows=True)


def prefill_part(meta: AttnMetadata, split: int) -> tuple[torch.Tensor, ...]:
    """query_start_loc, seq_lens and block_tables of the sequences after the first `split` (the
    decoding rows are the first `split` tokens: the rest start where they end). Copies, not
    slices: a slice starting `split` int32s in is 16-byte aligned only when split is a multiple
    of 4, and Triton compiles another kernel variant for a pointer that is not (a second of idle
    GPU in the middle of an H200 run). Built once per step, at its first layer."""
    if meta.prefill_part is None:
        meta.prefill_part = (
            meta.query_start_loc[split:] - split,
            meta.seq_lens[split:].clone(),
            meta.block_tables[split:].clone(),
        )
    return meta.prefill_part
