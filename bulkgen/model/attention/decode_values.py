"""A decode step's fp8 values stored by the decode launch, after it has read the sequence's other
positions (triton_decode_kernel.py's DEFER_V; the Triton backend on CUDA, decode-only steps of
more than decode_rotary.MAX_ROWS rows, where rotary_write's launch runs apart).

An fp8 cache keeps its values slots inner (kv_layout.py): a new token's value is 128 single bytes
a KV head, each 64 bytes from the next, each in its own 32-byte sector. Written by rotary_write's
launch a token a program, every one of those sectors is a partial write that L2 holds until it
evicts it, and at `trt`'s 889 rows (~0.9M sectors a layer, ~116 MB of L2 lines) it evicts most
before the decode launch reads them: each costs a read of the sector from HBM to merge, a write,
and the decode launch's read again. In the `trt` FP8 profile (72ac8cf, 889 rows) rotary_write took
0.90 ms a decode step over the fp8 cache against 0.26 over bf16 (whose values are rows: whole
sectors). With DEFER_V rotary_write rotates q and k and stores the keys only (whole sectors); every
decode program leaves the sequence's last position (the new token's) out of its loop, and the one
whose split holds it adds that position from the key just stored and the value in registers
(rounded through the cache's dtype as a read would), then stores the value: into sectors its loop
has just read, which L2 still holds.

Not bit-identical to rotary_write then decode: the new position's score is a float32 sum of
products where the loop's tl.dot sums another order, and its weight enters the accumulator
after the other positions instead of with its tile (tests/test_decode_values.py bounds it). The
cache's bits are write_kv's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from bulkgen.model.attention import decode_rotary
from bulkgen.model.attention.kv_fp8 import is_fp8
from bulkgen.model.attention.kv_layout import v_slots_inner
from bulkgen.model.switches import DECODE_DEFER_V_ENV, DECODE_MMA_ENV, switch

DEFER_V = True  # BULKGEN_DECODE_DEFER_V (1/0) switches it for A/B runs


class DeferredValues(NamedTuple):
    """A decode step's rotated queries q [B, Hq, D], whose keys are in the cache, with the values
    v [B, Hkv, D] (a view of the projection's rows) the decode launch stores at the slots [B]
    (< 0: a padding row, nothing written)."""

    q: torch.Tensor
    v: torch.Tensor
    slot_mapping: torch.Tensor


def defers_values(v_cache: torch.Tensor, pairs: bool, rows: int) -> bool:
    """Whether a decode-only step whose rotary runs apart (more than decode_rotary.MAX_ROWS rows)
    leaves its values to the decode launch: an fp8 cache with values slots inner, no paired first
    blocks, not on e4m3 products (decode_mma.py), unless BULKGEN_DECODE_DEFER_V=0."""
    if pairs or not is_fp8(v_cache) or not v_slots_inner(v_cache):
        return False
    if rows <= decode_rotary.MAX_ROWS:
        return False
    from bulkgen.model.attention import decode_mma  # Triton: imported on the GPU path only

    mma = switch(DECODE_MMA_ENV, decode_mma.DECODE_MMA)
    return not mma and switch(DECODE_DEFER_V_ENV, DEFER_V)
