"""How the varlen prefill kernel (triton_prefill.py) tiles its work: the tile sizes of each step
(and the one fixed tiling of the batch-invariant mode), and how a program finds its sequence."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q: tl.constexpr):
    """The last sequence b whose first tile, query_start_loc[b] // BLOCK_Q + b, is <= tile_id."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile_id:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def prefill_tiles(max_query_len: int, group: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_M, BLOCK_N): query positions and rows per tile, keys per K/V tile."""
    # 64 rows of head_dim 256 fp32 accumulators would spill with 4 warps.
    rows = 64 if head_dim <= 128 else 32
    if max_query_len * group <= 16:
        rows = 16  # decode-like steps: do not pad a few rows out to 64
    rows = max(rows, triton.next_power_of_2(group))
    block_n = 64 if head_dim <= 128 else 32
    return rows // group, rows, block_n


# Software-pipelining stages of the prefill launch over an fp8 cache (0: Triton's default, 3 on the
# H200). scripts/bench_prefill_tiles.py (then bench_attention.py --prefill-tiles) on the H200
# (406730b; 8B shape, values slots inner, 64-token blocks), us a call at the default 64x64 4-warp
# tiles, 3 stages against 2: a 1,648-token chunk 167.8 / 149.9, three prompts of 300-800 84.1 /
# 73.8, 1,024 behind 1,024 cached 178.1 / 161.8, 2,048 behind 14,336 2,687 / 2,519. Over a bf16
# cache 2 stages lost (107.8 / 114.4 at the 1,648 chunk), and no other of nine tilings won by more
# than 2% there.
FP8_STAGES = 2
# Whether the prefill kernel multiplies an 8-bit cache's tiles on fp16 operands (the query scaled
# before its rounding to fp16, as triton_decode.py's DOT_F16) rather than the query's bf16. On the
# H200 (c7331d4, scripts/bench_prefill_tiles.py, fp8 cache, 64x64 tiles, 4 warps, 2 stages) us a
# call with / without: a 1,648-token chunk 122.8 / 150.1, three prompts of 300-800 59.9 / 72.3,
# 1,024 behind 1,024 cached 130.6 / 162.7, 2,048 behind 14,336 2,046 / 2,517; its GPU test passed.
F16_PRODUCTS = True


# A step whose longest query has LONG_QUERY positions or more runs LONG_TILING (BLOCK_M, BLOCK_N,
# warps, stages) over a 16-bit or fp8 cache at head_dim 128 with a 16-bit query. On the H200
# (c7331d4, scripts/bench_prefill_tiles.py, 8B shape), us a call against the short launch
# (64x64, 4 warps): over bf16 a 1,648-token chunk 104.0 / 106.7, 1,024 behind 1,024 cached
# 99.1 / 111.8, 2,048 behind 14,336 1,428 / 1,662; over fp8 (fp16 products) 119.4 / 122.8,
# 119.7 / 130.6, 1,789 / 2,046. Three prompts of 300-800 lost with it (62.2 / 58.7 over bf16).
LONG_QUERY = 1024
LONG_TILING = (128, 128, 8, 2)


def prefill_launch(
    max_query_len: int, group: int, head_dim: int, fp8: bool, long_ok: bool
) -> tuple[int, int, int, int, int]:
    """(BLOCK_Q, BLOCK_M, BLOCK_N, warps, stages) of a step's launch (stages 0: Triton's
    default). long_ok: a 16-bit query over a 16-bit or fp8 cache (the shapes timed)."""
    block_m, block_n, warps, stages = LONG_TILING
    if long_ok and head_dim == 128 and max_query_len >= LONG_QUERY and block_m % group == 0:
        return block_m // group, block_m, block_n, warps, stages
    return (*prefill_tiles(max_query_len, group, head_dim), 4, FP8_STAGES if fp8 else 0)


def invariant_tiles(group: int, head_dim: int) -> tuple[int, int, int]:
    """The one tiling of the batch-invariant mode, whatever the step: the decode-like tile."""
    return prefill_tiles(1, group, head_dim)
