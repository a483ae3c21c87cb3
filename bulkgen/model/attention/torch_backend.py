"""Reference attention over the paged KV cache in plain torch.

The CPU path and the correctness oracle for the Triton kernels. One-token rows (decode) are done
together over contexts padded to the longest (one SDPA call); longer rows loop per sequence,
one causal SDPA call each.
Lengths come from the plan's host-side lists, so it never syncs with the device.
An fp8 cache (kv_fp8.py) is quantized on write and dequantized on read with the layer's scales;
an int8 cache (kv_int8.py) likewise with its scale tensors, one per (slot, kv head), which then
come where an fp8 cache's float scales do. With first-block partners (kv_pairs.py: the write's
`partners`, AttnMetadata.kv_partners) an fp8 block that has one reads back hi + lo.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bulkgen.model.attention import kv_int8, kv_pairs
from bulkgen.model.attention.kv_fp8 import dequantize, is_fp8, quantize
from bulkgen.model.attention.metadata import AttnMetadata

# A layer's scales: floats for an fp8 cache, [num_blocks, block_size, Hkv] tensors for int8.
Scale = float | torch.Tensor


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    partners: torch.Tensor | None = None,
) -> None:
    """Store this step's keys/values [T, Hkv, D] at their slots of the [N, bs, Hkv, D] caches
    (an fp8 cache stores x / scale; an int8 cache stores each row quantized and its scale in the
    scale tensor at the same slot; the scales are ignored by other caches). partners: [N] int
    first-block partners of an fp8 cache (kv_pairs.py), where the low parts go."""
    num_kv_heads, head_dim, block_size = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    paired = None
    if partners is not None and is_fp8(k_cache):
        lo_blocks = partners[slots // block_size].long()
        paired = lo_blocks >= 0
        lo_slots = lo_blocks[paired] * block_size + slots[paired] % block_size
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        rows = cache.view(-1, num_kv_heads, head_dim)
        if is_fp8(cache):  # index_copy_ has no float8 kernel on the CPU: copy the bytes
            hi = quantize(x[keep], scale)
            rows.view(torch.uint8).index_copy_(0, slots, hi.view(torch.uint8))
            if paired is not None:
                lo = kv_pairs.low_part(x[keep][paired], hi[paired], scale)
                rows.view(torch.uint8).index_copy_(0, lo_slots, lo.view(torch.uint8))
        elif kv_int8.is_int8(cache):
            q, row_scales = kv_int8.quantize(x[keep])
            rows.index_copy_(0, slots, q)
            scale.view(-1, num_kv_heads).index_copy_(0, slots, row_scales)
        else:
            rows.index_copy_(0, slots, x[keep].to(cache.dtype))


def _read(
    cache: torch.Tensor, blocks: torch.Tensor, scale: Scale, partners: torch.Tensor | None = None
) -> torch.Tensor:
    """The cached rows of these blocks (any shape of block ids) in float32; an fp8 block with a
    partner (kv_pairs.py) as hi + lo."""
    # index_select copies whole blocks 4x faster on the CPU than advanced indexing does; an fp8
    # cache is selected as bytes (index_select need not have a float8 kernel on every device).
    index, shape = blocks.reshape(-1).long(), (*blocks.shape, *cache.shape[1:])
    if is_fp8(cache):
        raw = cache.view(torch.uint8)
        rows = raw.index_select(0, index).view(cache.dtype).view(shape)
        if partners is None:
            return dequantize(rows, scale)
        lo_index = partners.index_select(0, index).long()
        lo = raw.index_select(0, lo_index.clamp(min=0)).view(cache.dtype).view(shape)
        lo_part = lo.float() * kv_pairs.LO_SCALE
        paired = (lo_index >= 0).view(*blocks.shape, *[1] * (cache.dim() - 1))
        return (rows.float() + torch.where(paired, lo_part, 0.0)) * scale
    if kv_int8.is_int8(cache):
        rows = cache.index_select(0, index).view(shape)
        return kv_int8.dequantize(rows, scale.index_select(0, index).view(shape[:-1]))
    return cache.index_select(0, index).view(shape).float()


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

    Computed in float32 whatever the cache dtype; k_scale/v_scale dequantize an fp8 or int8
    cache.
    """
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    q_lens, seq_lens = meta.query_lens_host, meta.seq_lens_host
    if q_lens is None or seq_lens is None:
        raise ValueError("the torch attention backend needs host-side lengths in AttnMetadata")
    out = torch.empty_like(q) if out is None else out
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    decode = [b for b, n in enumerate(q_lens) if n == 1]
    if decode:  # all one-token rows at once: the common case, and per-row loops are slow
        rows = torch.tensor([starts[b] for b in decode], device=q.device)
        lens = [seq_lens[b] for b in decode]
        tables = meta.block_tables[decode]
        scales = (k_scale, v_scale, meta.kv_partners)
        out[rows] = _decode_rows(q[rows], k_cache, v_cache, tables, lens, scale, *scales)
    for b, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
        if q_len == 1:
            continue
        start = starts[b]
        num_blocks = -(-seq_len // block_size)
        blocks = meta.block_tables[b, :num_blocks].long()
        partners = meta.kv_partners
        k = _read(k_cache, blocks, k_scale, partners).reshape(-1, num_kv_heads, head_dim)
        v = _read(v_cache, blocks, v_scale, partners).reshape(-1, num_kv_heads, head_dim)
        k, v = k[:seq_len], v[:seq_len]
        # [Hkv, G, q_len, D] against [Hkv, G, seq_len, D] (the group's heads share their KV
        # head's keys through a stride-0 expand); causal from this step's first position.
        qb = q[start : start + q_len].float().view(q_len, num_kv_heads, group, head_dim)
        kb, vb = (x.permute(1, 0, 2)[:, None].expand(-1, group, -1, -1) for x in (k, v))
        mask = None
        if q_len < seq_len:  # a later chunk, or after a prefix-cache hit
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        ob = F.scaled_dot_product_attention(
            qb.permute(1, 2, 0, 3), kb, vb, attn_mask=mask, is_causal=mask is None, scale=scale
        )
        out[start : start + q_len] = ob.permute(2, 0, 1, 3).reshape(q_len, num_q_heads, head_dim)
    return out


def _decode_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    scale: float,
    k_scale: Scale,
    v_scale: Scale,
    partners: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query row per sequence, q [B, Hq, D], over contexts padded to the longest."""
    batch, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    width = -(-max(seq_lens) // block_size)
    lens = torch.tensor(seq_lens, device=q.device)
    # Table entries past a sequence's own blocks are arbitrary: read block 0 there (masked).
    owned = (
        torch.arange(width, device=q.device)[None, :]
        < (lens[:, None] + block_size - 1) // block_size
    )
    blocks = torch.where(owned, block_tables[:, :width].long(), 0)
    pad = torch.arange(width * block_size, device=q.device)[None, :] >= lens[:, None]
    shape = (batch, width * block_size, num_kv_heads, head_dim)
    k = _read(k_cache, blocks, k_scale, partners).view(shape)
    v = _read(v_cache, blocks, v_scale, partners).view(shape)
    # Padding slots may hold anything (NaN included): zeroed in place in these fresh copies, as
    # a NaN would survive the mask (NaN + -inf) in the scores and 0 * NaN in the weighted sum.
    # (index_fill_ over the padded rows: masked_fill_ with a broadcast mask is 5x slower.)
    padded = pad.view(-1).nonzero().squeeze(1)
    k.view(-1, num_kv_heads * head_dim).index_fill_(0, padded, 0.0)
    v.view(-1, num_kv_heads * head_dim).index_fill_(0, padded, 0.0)
    # The group's query heads as the query rows of their KV head: one query position each, so
    # they share the row's mask, and SDPA needs no GQA support (torch < 2.5).
    group = num_q_heads // num_kv_heads
    qg = q.float().view(batch, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(
        qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=~pad[:, None, None, :], scale=scale
    )
    return out.reshape(batch, num_q_heads, head_dim).to(q.dtype)
