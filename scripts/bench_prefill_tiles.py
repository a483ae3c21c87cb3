"""The prefill kernel's candidate launches (triton_prefill.paged_prefill's tiling and
f16_products) over a bf16 and an fp8 cache, at the 8B shape (GPU).

    PYTHONPATH=. python scripts/bench_prefill_tiles.py --kv-cache-dtype auto,fp8

One JSON line per (cache, case): microseconds a call of each launch (8 calls back to back in one
CUDA graph, bench_attention.steps_us), the best and its TFLOP/s, and the largest difference from
the default launch's output. Each cache in the engine's value layout and block size.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from bench_attention import DTYPE, HEAD_DIM, NUM_Q_HEADS, paged_inputs, steps_us

from bulkgen.model.attention import triton_prefill
from bulkgen.model.attention.decode_tiling import fp8_v_slots_inner
from bulkgen.model.attention.kv_fp8 import resolve_kv_dtype
from bulkgen.model.attention.kv_int8 import INT8_DTYPE
from bulkgen.model.attention.kv_layout import block_size_for, to_slots_inner

# (BLOCK_M, BLOCK_N, warps, stages) launches of the prefill kernel (stages 0: Triton's default);
# the first is prefill_tiles' for long queries at the 8B shape.
PREFILL_TILINGS = (
    (64, 64, 4, 0),
    (64, 64, 4, 2),
    (64, 128, 4, 2),
    (128, 32, 4, 3),
    (128, 64, 4, 2),
    (128, 64, 8, 2),
    (128, 64, 8, 3),
    (128, 128, 8, 2),
    (128, 128, 8, 3),
)
# The launches also timed with an 8-bit cache's products on fp16 operands (names ending f16).
F16_TILINGS = ((64, 64, 4, 2), (128, 64, 4, 2), (128, 128, 8, 2))
# (sequence lengths, query lengths): a bulk mixed step's chunk alone, three new prompts filling
# one, a chunk behind 1,024 cached tokens, a 16K prompt's last chunk, and a `trt` step's prefill
# (seven new 1,000-token prompts and the start of an eighth).
PREFILL_CASES = (([1648], [1648]), ([300, 548, 800], [300, 548, 800]), ([2048], [1024]))
PREFILL_CASES += (([16384], [2048]), ([1000] * 7 + [303], [1000] * 7 + [303]))


def bench_prefill_tiles(kv_dtype) -> list[dict]:
    """Microseconds per call of each PREFILL_TILINGS launch (8 calls a graph), for each case."""
    rows, slots_inner = [], kv_dtype == torch.float8_e4m3fn and fp8_v_slots_inner()
    for seq_lens, query_lens in PREFILL_CASES:  # the engine's layout and block size
        q, k_cache, v_cache, meta, (k_scale, v_scale) = paged_inputs(
            seq_lens, query_lens, False, kv_dtype, block_size_for(slots_inner)
        )
        v_cache = to_slots_inner(v_cache) if slots_inner else v_cache
        scale, args = HEAD_DIM**-0.5, (meta.query_start_loc, meta.seq_lens, meta.block_tables)
        out = torch.empty_like(q)
        ref = triton_prefill.paged_prefill(
            q, k_cache, v_cache, *args, meta.max_query_len, scale, k_scale, v_scale
        )
        us, worst = {}, 0.0
        eight_bit = kv_dtype in (torch.float8_e4m3fn, INT8_DTYPE)
        runs = [(t, False) for t in PREFILL_TILINGS]
        runs += [(t, True) for t in F16_TILINGS if eight_bit]  # triton_prefill's DOT_F16
        for tiling, f16 in runs:
            call = functools.partial(
                triton_prefill.paged_prefill, q, k_cache, v_cache, *args, meta.max_query_len,
                scale, k_scale, v_scale, out=out, tiling=tiling, f16_products=f16,
            )  # fmt: skip
            name = "m{}n{}w{}s{}".format(*tiling) + ("f16" if f16 else "")
            try:
                us[name] = round(steps_us([call] * 8), 1)
                worst = max(worst, (out.float() - ref.float()).abs().max().item())
            except Exception as e:  # out of shared memory or registers: not a candidate
                us[name] = repr(e)[:80]
        pairs = sum(
            q_len * (s - q_len) + q_len * (q_len + 1) // 2
            for s, q_len in zip(seq_lens, query_lens, strict=True)
        )
        timed = {k: v for k, v in us.items() if isinstance(v, float)}
        best = min(timed, key=timed.__getitem__)
        rows.append({
            "kernel": "prefill-tiles",
            "kv_dtype": str(kv_dtype).removeprefix("torch."),
            "seq_lens": seq_lens,
            "query_lens": query_lens,
            "v_slots_inner": slots_inner,
            "best": best,
            "best_tflop_per_s": round(4 * NUM_Q_HEADS * HEAD_DIM * pairs / timed[best] / 1e6, 1),
            "max_abs_diff": worst,
            "us": us,
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-cache-dtype", default="auto,fp8", help="a list: auto,fp8,int8")
    args = parser.parse_args()
    for name in args.kv_cache_dtype.split(","):
        for row in bench_prefill_tiles(resolve_kv_dtype(name, DTYPE)):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
