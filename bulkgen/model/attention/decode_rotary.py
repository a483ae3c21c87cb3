"""A decode step's rotary embedding and KV write inside the decode launch (triton_decode_kernel.py's
ROTATE; the Triton backend on CUDA, decode-only steps).

A decode-only step otherwise runs two launches a layer between the qkv projection and attention's
merge: rotary_write.py's (rotate q and k, write k and v to the cache) and the decode kernel. With
ROTATE the decode kernel takes the projection's unrotated q, k and v (an Unrotated, built by
llama.Attention.qkv_cache instead of launching rotary_write): every program rotates its GROUP
query heads as it loads them, and the one program whose split holds the sequence's last position
rotates its kv head's key, writes key and value to the new token's slot (fp8 scaled and
saturated as write_kv does), and waits at a barrier before its loop reads that slot back. One
launch a layer fewer, the same bits: the roundings are fused_rotary._rotate_heads' (cos, sin,
each product and each sum rounded to the model's dtype), each rounding a cvt in PTX on the GPU
(round_to): rotary_write's launch keeps them by turning FP fusion off (the compiler fused a
product into an FMA past its bf16 rounding), which the decode kernel's own arithmetic keeps on.
Measured on the H200 (8fcdda6, one call, blog, off/on alternating twice): FP8 decode steps 3.957
/ 3.956 ms against 4.031, bf16 5.943 / 5.941 against 5.981 / 5.980; its GPU tests (the launch
at the 8B shape against rotary_write then decode, bit for bit; the engine's tokens) passed.

Not taken (rotary_write runs as before): decode steps of more than MAX_ROWS rows, steps with
prefill (mixed_graphs.py's pieces write q into a static buffer), an int8 cache (its per-row
scales), paired first blocks (kv_pairs.py), the batch-invariant backend, or DECODE_ROTARY off
(BULKGEN_DECODE_ROTARY=0). The kernel's parts: triton_decode_rotary.py (this module imports no
Triton: llama.py builds Unrotated on any device).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from bulkgen.model.switches import DECODE_ROTARY_ENV, switch

DECODE_ROTARY = True  # BULKGEN_DECODE_ROTARY (1/0) switches it for A/B runs
# Up to this many rows a step (on the H200 at 8fcdda6, one call: blog's 32 rows ran 1.9% faster
# in FP8 and 0.7% in bf16, decode steps 3.957 against 4.031 ms and 5.942 against 5.981; bulk's
# 512 ran 1.4% slower in FP8, 12.861 against 12.687 ms, and flat in bf16; not profiled, but
# there every program of the unsplit launch writes before it reads). Timed alone at 56555ac
# (bench_decode_rotary.py, fp8 cache, 1,500 tokens, 32 layers a graph): the one launch took
# 0.998x the two launches' time at 128 rows, 1.009x at 256, 1.017x at 512, 1.020x at 889.
MAX_ROWS = 64


class Unrotated(NamedTuple):
    """A decode step's queries before the rotary embedding, with what the decode launch needs to
    rotate them and to rotate and write the step's keys and values: q [B, Hq, D], k and v
    [B, Hkv, D] (views of the projection's rows), positions [B], the float32 cos/sin tables
    [positions, D / 2] and the slots [B] (< 0: a padding row, nothing written)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slot_mapping: torch.Tensor


def defers(k_cache: torch.Tensor, pairs: bool, rows: int) -> bool:
    """Whether a decode-only step's rotary and write go into its decode launch: a 16-bit, float32
    or fp8 cache without paired first blocks, up to MAX_ROWS rows (a CUDA graph's batch: its
    shape, fixed at capture), unless BULKGEN_DECODE_ROTARY=0."""
    if pairs or k_cache.dtype == torch.int8 or rows > MAX_ROWS:
        return False
    return switch(DECODE_ROTARY_ENV, DECODE_ROTARY)


def round_in_ptx(device: torch.device) -> bool:
    """round_to's PTX form: on CUDA, compiled (the interpreter's casts round as torch does)."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"


def rotation_args(rotate: Unrotated | None, q: torch.Tensor, k_scale, v_scale) -> tuple:
    """The decode kernel's ROTATE arguments (k_new_ptr ... v_inv_scale), placeholders without."""
    if rotate is None:
        return (q, q, 0, 0, 0, 0, q, q, q, 0, 0, q, 1.0, 1.0)
    k, v, cos, sin = rotate.k, rotate.v, rotate.cos, rotate.sin
    assert k.stride(-1) == v.stride(-1) == 1 and cos.shape[-1] * 2 == q.shape[-1]
    assert k.shape == v.shape and rotate.positions.shape == rotate.slot_mapping.shape
    return (
        k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        rotate.positions, cos, sin, cos.stride(0), sin.stride(0), rotate.slot_mapping,
        1.0 / k_scale, 1.0 / v_scale,
    )  # fmt: skip
