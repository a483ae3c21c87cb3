"""The decode kernel's time per launch as a step runs it: 32 launches (one per layer, each over
its own K/V cache) back to back in one CUDA graph, at blog's 32 rows and contexts from 128 to
4,096 tokens, bf16 and fp8 caches, the engine's launch (decode_tilings.json); no L2 clear
between replays (the caches, 32 distinct ones, outgrow the L2 from 512 tokens up).

    PYTHONPATH=. python scripts/bench_decode_layers.py [--rows 32] [--caches bf16,fp8,fp8mma]

fp8mma: the fp8 cache on e4m3 products (decode_mma.py, BULKGEN_FP8_DECODE_MMA=1 while it runs);
fp8 then runs with that switch 0.

One JSON line per (cache, context): microseconds per launch and the K/V bytes read per second,
then a summary per cache: the least-squares line us = fixed + per_token * context over the
contexts from 512 up, whose intercept is the launch's cost beside its reads (tune_decode.py's
single-launch timings at 32 rows give 15-20 us of it at f85933e, L2 cleared before each).
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import torch
from bench_attention import HEAD_DIM, NUM_KV_HEADS, paged_inputs, steps_us
from bench_commit import git_commit

from bulkgen.model.attention.decode_tiling import decode_launch, fp8_v_slots_inner
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE
from bulkgen.model.attention.kv_layout import block_size_for, to_slots_inner
from bulkgen.model.attention.triton_decode import paged_decode
from bulkgen.model.switches import DECODE_MMA_ENV

LAYERS = 32
CONTEXTS = (128, 256, 512, 1024, 2048, 4096)
# A cache's name: its dtype and whether its decode runs on e4m3 products (decode_mma.py).
CACHES = {"bf16": (torch.bfloat16, "0"), "fp8": (FP8_DTYPE, "0"), "fp8mma": (FP8_DTYPE, "1")}


def layers_us(rows: int, context: int, kv_dtype) -> float:
    """Microseconds per launch of LAYERS launches over distinct caches in one graph."""
    fp8 = kv_dtype == FP8_DTYPE
    slots_inner = fp8 and fp8_v_slots_inner()
    launch = decode_launch(HEAD_DIM, fp8, rows, "fp8" if fp8 else "auto")
    calls = []
    for _ in range(LAYERS):
        q, k, v, meta, _ = paged_inputs(
            [context] * rows, [1] * rows, True, kv_dtype, block_size_for(slots_inner)
        )
        v = to_slots_inner(v) if slots_inner else v
        calls.append((q, k, v, meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5))

    us = steps_us([functools.partial(paged_decode, *args, launch=launch) for args in calls])
    del calls
    torch.cuda.empty_cache()
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--caches", default="bf16,fp8", help=f"of {', '.join(CACHES)}")
    args = parser.parse_args()
    for name in args.caches.split(","):
        kv_dtype, mma = CACHES[name]
        os.environ[DECODE_MMA_ENV] = mma  # read as each launch is captured
        points = []
        for context in CONTEXTS:
            us = layers_us(args.rows, context, kv_dtype)
            kv_bytes = 2 * args.rows * context * NUM_KV_HEADS * HEAD_DIM * kv_dtype.itemsize
            line = {"cache": name, "rows": args.rows, "context": context, "us": round(us, 2)}
            line["tb_per_s"] = round(kv_bytes / us / 1e6, 2)
            print(json.dumps(line), flush=True)
            points.append((context, us))
        xs = torch.tensor([c for c, _ in points if c >= 512], dtype=torch.float64)
        ys = torch.tensor([u for c, u in points if c >= 512], dtype=torch.float64)
        slope = ((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()
        fixed = ys.mean() - slope * xs.mean()
        bytes_per_token = 2 * args.rows * NUM_KV_HEADS * HEAD_DIM * kv_dtype.itemsize
        summary = {"summary": "decode_layers", "cache": name, "rows": args.rows}
        summary["fixed_us"] = round(float(fixed), 2)
        summary["marginal_tb_per_s"] = round(bytes_per_token / float(slope) / 1e6, 2)
        print(json.dumps({**summary, "git_commit": git_commit()}), flush=True)


if __name__ == "__main__":
    main()
