"""Steps of every kind over one paged cache, for the batch-invariant attention tests.

A Sequence holds, for each of its positions, the query and the keys/values its cache holds there.
build_step lays a step out as the engine would: each part (sequence, end, q_len) has the first
`end` positions cached (in freshly shuffled blocks, so no two steps place a sequence alike) and
queries its last q_len positions; every slot that no part has written yet holds NaN, so a kernel
that reads one shows. With pad_to the step is a decode step padded to a CUDA-graph bucket through
DecodeGraphBuffers, as the decode graphs see it (fill_graph_buffers: what the engine's staging
kernel, triton_stage.py, writes; tested equal in test_triton_stage.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bulkgen.model.attention import AttentionBackend, kv_int8
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE, quantize
from bulkgen.model.attention.metadata import AttnMetadata, DecodeGraphBuffers

K_SCALE, V_SCALE = 0.25, 3.0  # an fp8 cache's layer scales: distinct and not 1


@dataclass(frozen=True)
class Shape:
    num_kv_heads: int
    group: int
    head_dim: int
    block_size: int
    dtype: torch.dtype  # the queries' and outputs'
    cache_dtype: torch.dtype  # the dtype's own, FP8_DTYPE or int8 (scales per token and head)

    @property
    def num_q_heads(self) -> int:
        return self.num_kv_heads * self.group

    @property
    def scales(self) -> tuple[float, float]:
        return (K_SCALE, V_SCALE) if self.cache_dtype == FP8_DTYPE else (1.0, 1.0)

    @property
    def int8(self) -> bool:
        return self.cache_dtype == kv_int8.INT8_DTYPE


@dataclass(frozen=True)
class Sequence:
    q: torch.Tensor  # [L, Hq, D] in shape.dtype
    k: torch.Tensor  # [L, Hkv, D] in shape.cache_dtype: what the cache holds at each position
    v: torch.Tensor
    k_scales: torch.Tensor | None = None  # [L, Hkv]: an int8 cache's scales
    v_scales: torch.Tensor | None = None


def make_sequence(length: int, shape: Shape, device: torch.device) -> Sequence:
    kv = (length, shape.num_kv_heads, shape.head_dim)
    q = torch.randn(length, shape.num_q_heads, shape.head_dim, device=device).to(shape.dtype)
    k, v = torch.randn(kv, device=device), torch.randn(kv, device=device)
    if shape.cache_dtype == FP8_DTYPE:  # scaled to use e4m3's range, not only its top
        return Sequence(q, quantize(k * K_SCALE * 4, K_SCALE), quantize(v * V_SCALE, V_SCALE))
    if shape.int8:  # rows of magnitudes 10**U(-2, 1): scales differ per token and head
        (k8, k_s), (v8, v_s) = (
            kv_int8.quantize(x * 10 ** (torch.rand(*kv[:2], 1, device=device) * 3 - 2))
            for x in (k, v)
        )
        return Sequence(q, k8, v8, k_s, v_s)
    return Sequence(q, k.to(shape.cache_dtype), v.to(shape.cache_dtype))


@dataclass
class Step:
    q: torch.Tensor  # [T, Hq, D] (padded to the bucket with random rows when pad_to)
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttnMetadata
    rows: list[slice]  # each part's rows of q and of the output
    k_scales: torch.Tensor | None = None  # an int8 cache's [num_blocks, block_size, Hkv]
    v_scales: torch.Tensor | None = None


def build_step(
    parts: list[tuple[Sequence, int, int]],
    shape: Shape,
    device: torch.device,
    pad_to: int | None = None,
    width: int | None = None,
) -> Step:
    """One step's queries, caches and metadata; width: the block tables' columns."""
    bs = shape.block_size
    blocks_per_part = [-(-end // bs) for _, end, _ in parts]
    num_blocks = sum(blocks_per_part) + 3
    width = width or max(blocks_per_part) + 2
    cache_shape = (num_blocks, bs, shape.num_kv_heads, shape.head_dim)
    nan = torch.full(cache_shape, float("nan"), device=device)
    k_cache, v_cache = nan.to(shape.cache_dtype), nan.to(shape.cache_dtype)
    # An int8 cache's unwritten slots: NaN scales, as NaN values elsewhere.
    scales = [nan[..., 0].clone() for _ in "kv"] if shape.int8 else []
    tables = torch.zeros(len(parts), width, dtype=torch.int32, device=device)
    free = torch.randperm(num_blocks, device=device)
    slots, queries = [], []
    for b, ((seq, end, q_len), n) in enumerate(zip(parts, blocks_per_part, strict=True)):
        blocks, free = free[:n], free[n:]
        tables[b, :n] = blocks.int()
        positions = torch.arange(end, device=device)
        seq_slots = blocks[positions // bs] * bs + positions % bs
        for cache, values in ((k_cache, seq.k), (v_cache, seq.v)):
            flat = cache.view(-1, shape.num_kv_heads, shape.head_dim).view(torch.uint8)
            flat[seq_slots] = values[:end].view(torch.uint8)  # bytes: fp8 has no index_put
        if shape.int8:
            for cache, values in zip(scales, (seq.k_scales, seq.v_scales), strict=True):
                cache.view(-1, shape.num_kv_heads)[seq_slots] = values[:end]
        slots.append(seq_slots[end - q_len :])
        queries.append(seq.q[end - q_len : end])
    q_lens = [q_len for _, _, q_len in parts]
    seq_lens = [end for _, end, _ in parts]
    starts = torch.tensor([0] + q_lens, device=device).cumsum(0).int()
    meta = AttnMetadata(
        slot_mapping=torch.cat(slots),
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables,
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        decode_only=max(q_lens) == 1,
        query_lens_host=q_lens,
        seq_lens_host=seq_lens,
    )
    rows = [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    q = torch.cat(queries)
    if pad_to is not None:
        assert meta.decode_only and pad_to >= len(parts)
        buffers = DecodeGraphBuffers(pad_to, width, device)
        fill_graph_buffers(buffers, meta, pad_to)
        meta = buffers.view(pad_to)  # no host lengths, as in a graph...
        # ...but the torch backends (never captured) read them: a padding row is 1 token long.
        meta.query_lens_host = [1] * pad_to
        meta.seq_lens_host = seq_lens + [1] * (pad_to - len(parts))
        padding = torch.randn(pad_to - len(parts), *q.shape[1:], device=device)
        q = torch.cat([q, padding.to(q.dtype)])
    return Step(q, k_cache, v_cache, meta, rows, *scales)


def attend(backend: AttentionBackend, step: Step, shape: Shape) -> torch.Tensor:
    k_scale, v_scale = (step.k_scales, step.v_scales) if shape.int8 else shape.scales
    scale = shape.head_dim**-0.5
    return backend.attend(step.q, step.k_cache, step.v_cache, step.meta, scale, k_scale, v_scale)


def run_step(
    backend: AttentionBackend,
    parts: list[tuple[Sequence, int, int]],
    shape: Shape,
    device: torch.device,
    pad_to: int | None = None,
) -> list[torch.Tensor]:
    """Each part's output rows [q_len, Hq, D] from one step."""
    step = build_step(parts, shape, device, pad_to)
    out = attend(backend, step, shape)
    return [out[rows] for rows in step.rows]


def fill_graph_buffers(buffers: DecodeGraphBuffers, meta: AttnMetadata, bucket: int) -> None:
    """A step's metadata of b <= bucket rows copied in; rows b.. are padding: they write no KV
    (slot -1) and attend to one token of whatever block their stale table row names."""
    b = meta.seq_lens.shape[0]
    buffers.slot_mapping[:b].copy_(meta.slot_mapping)
    buffers.slot_mapping[b:bucket].fill_(-1)
    buffers.seq_lens[:b].copy_(meta.seq_lens)
    buffers.seq_lens[b:bucket].fill_(1)
    buffers.block_tables[:b].copy_(meta.block_tables)
