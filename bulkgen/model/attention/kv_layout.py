"""How the paged KV cache lies in memory: one allocation, and each layer's (k, v) views (with an
int8 cache's scales beside them).

Every view has the logical shape [num_blocks, block_size, num_kv_heads, head_dim]. Keys are always
stored that way (head_dim contiguous: the q @ K^T product reduces along it). Values come in two
layouts:

- rows (the default): like keys, each token's [num_kv_heads, head_dim] row contiguous;
- slots inner: each block stored as [num_kv_heads, head_dim, block_size], so a block's tokens are
  contiguous for every head and dim. The P @ V product reduces along the tokens, and an 8-bit V
  tile stored with tokens outermost can only be read back from shared memory a byte at a time
  (no 8-bit ldmatrix.trans: scripts/compile_check_attention.py counts 128 such reads a thread in
  the fp8 decode kernel, none with this layout, which also needs 122-128 registers a thread at
  128-token tiles against 166-199: scripts/kernel_resources.py). The cache is then zeroed at
  allocation: the kernels read whole blocks (triton_kv.load_v_tile), so the slots past a
  sequence's end must hold finite values.

Keys may be stored heads outer too (each block as [num_kv_heads, block_size, head_dim]; the
view keeps the logical shape), an experiment off unless BULKGEN_K_HEADS_OUTER=1: in rows, a kv
head's keys of one token are head_dim elements every num_kv_heads * head_dim (128 bytes every
1 KB for an fp8 cache at the 8B shape), read by a decode program that sees only its head; heads
outer, a block's keys of one head are one run (8 KB at 64 tokens). Whether that reads faster is
measured on the GPU (gpu_check_fp8.sh step kheads), not assumed.

The Triton kernels take K's and V's strides and handle every layout; the torch backends need rows.
Which layout the engine allocates for an fp8 cache is measured (decode_tiling.fp8_v_slots_inner);
an int8 cache, whose tiles are read the same way (1 byte an element, converted to 16 bits in
registers), takes the same layout (values_slots_inner).

A slots-inner block stores each dim's values of its tokens contiguous: block_size bytes for fp8.
At 16 tokens that is half a 32-byte L2 sector, and the decode kernel's V loads fetched twice their
ideal sectors (Nsight Compute on the H200, 256 rows x 2K: 2x for every V load, L2 83% busy with
DRAM at 66%), so such a cache takes blocks of SLOTS_INNER_BLOCK_SIZE tokens by default
(block_size_for).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from bulkgen.model.attention.kv_int8 import INT8_DTYPE, allocate_kv_scales
from bulkgen.model.switches import INT8_V_SLOTS_INNER_ENV, K_HEADS_OUTER_ENV, switch

# scripts/exp_decode_swap.py --block-sizes on the H200 (8B shape, fp8 values slots inner, the
# tuned launch): 256 rows x 2K 0.355 / 0.308 / 0.288 ms at 16 / 32 / 64-token blocks, 512 x 2K
# 0.704 / 0.615 / 0.568, 32 x 2K 0.065 / 0.056 / 0.054 (the bf16 kernel: 0.523, 1.035, 0.085 at
# 16, no faster at 32 or 64). 64 tokens is 4 sectors per dim, the prefix cache's unit then.
SLOTS_INNER_BLOCK_SIZE = 64
DEFAULT_BLOCK_SIZE = 16


def block_size_for(v_slots_inner: bool) -> int:
    """The engine's tokens per KV block when EngineConfig.block_size is None."""
    return SLOTS_INNER_BLOCK_SIZE if v_slots_inner else DEFAULT_BLOCK_SIZE


def keys_heads_outer() -> bool:
    """Whether the Triton backend's caches store keys heads outer (BULKGEN_K_HEADS_OUTER)."""
    return switch(K_HEADS_OUTER_ENV, False)


def values_slots_inner(kv_dtype: torch.dtype, measured: bool) -> bool:
    """Whether a cache of this dtype stores its values slots inner, where the backend's measured
    choice for 8-bit caches (AttentionBackend.fp8_v_slots_inner) is `measured`: fp8 and int8
    caches (an int8 one in rows when BULKGEN_INT8_V_SLOTS_INNER=0); 16-bit ones never."""
    if not measured or kv_dtype.itemsize != 1:
        return False
    return kv_dtype != INT8_DTYPE or switch(INT8_V_SLOTS_INNER_ENV, True)


class KVCache(NamedTuple):
    """One run's cache: the values' storage [num_layers, 2, num_blocks, block elements], an int8
    cache's scales (kv_int8.allocate_kv_scales; None for other dtypes), and each layer's views:
    (k, v), or (k, v, k_scales, v_scales) for int8, as the attention layers take them."""

    values: torch.Tensor
    scales: torch.Tensor | None
    layers: list[tuple[torch.Tensor, ...]]


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    v_slots_inner: bool = False,
    k_heads_outer: bool = False,
) -> KVCache:
    """The cache of this shape and dtype, values in the rows layout or slots inner, keys in rows
    or heads outer."""
    elements = block_size * num_kv_heads * head_dim
    make = torch.zeros if v_slots_inner else torch.empty
    storage = make((num_layers, 2, num_blocks, elements), dtype=dtype, device=device)
    views = []
    for layer in storage:
        if k_heads_outer:
            k = layer[0].view(num_blocks, num_kv_heads, block_size, head_dim).transpose(1, 2)
        else:
            k = layer[0].view(num_blocks, block_size, num_kv_heads, head_dim)
        if v_slots_inner:
            v = layer[1].view(num_blocks, num_kv_heads, head_dim, block_size).permute(0, 3, 1, 2)
        else:
            v = layer[1].view(num_blocks, block_size, num_kv_heads, head_dim)
        views.append((k, v))
    if dtype != INT8_DTYPE:
        return KVCache(storage, None, views)
    scales, scale_views = allocate_kv_scales(
        num_layers, num_blocks, block_size, num_kv_heads, device
    )
    return KVCache(storage, scales, [(*kv, *s) for kv, s in zip(views, scale_views, strict=True)])


def v_slots_inner(v_cache: torch.Tensor) -> bool:
    """Whether a [num_blocks, block_size, num_kv_heads, head_dim] V cache is laid out slots
    inner (every stride a multiple of block_size but the slot's, which is 1)."""
    _, block_size, heads, dim = v_cache.shape
    return block_size > 1 and v_cache.stride() == (
        heads * dim * block_size,
        1,
        dim * block_size,
        block_size,
    )


def k_heads_outer(k_cache: torch.Tensor) -> bool:
    """Whether a [num_blocks, block_size, num_kv_heads, head_dim] K cache is stored heads
    outer (each block [num_kv_heads, block_size, head_dim])."""
    _, block_size, heads, dim = k_cache.shape
    return heads > 1 and k_cache.stride() == (heads * block_size * dim, dim, block_size * dim, 1)


def to_heads_outer(k_cache: torch.Tensor) -> torch.Tensor:
    """A copy of a K cache's keys stored heads outer (benchmarks and tests)."""
    blocks, block_size, heads, dim = k_cache.shape
    out = torch.empty(blocks, heads, block_size, dim, dtype=k_cache.dtype, device=k_cache.device)
    return out.transpose(1, 2).copy_(k_cache)


def to_slots_inner(v_cache: torch.Tensor) -> torch.Tensor:
    """A copy of a V cache's values stored slots inner (benchmarks and tests)."""
    blocks, block_size, heads, dim = v_cache.shape
    out = torch.empty(blocks, heads, dim, block_size, dtype=v_cache.dtype, device=v_cache.device)
    return out.permute(0, 3, 1, 2).copy_(v_cache)
