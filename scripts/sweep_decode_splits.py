"""Sweep the decode kernel's KV splits per (sequence, kv head) at the 8B shape; one JSON line each.

    PYTHONPATH=. python scripts/sweep_decode_splits.py [--kv-cache-dtype auto,fp8]

Each (batch, context) is timed at every split count with the engine's launch for that batch
(decode_tilings.json; an fp8 cache in the value layout the table chooses), then a summary line per
cache kind: the fastest split count at each shape against the engine's own choice
(num_kv_splits over a long max_model_len, as in the engine, where the block table is wide).
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from bench_attention import HEAD_DIM, NUM_KV_HEADS, median_ms, paged_inputs
from bench_commit import git_commit

from bulkgen.model.attention.decode_tiling import decode_launch, fp8_v_slots_inner, num_kv_splits
from bulkgen.model.attention.kv_fp8 import resolve_kv_dtype
from bulkgen.model.attention.kv_layout import to_slots_inner
from bulkgen.model.attention.triton_decode import paged_decode

BATCHES = (1, 8, 16, 32, 64, 128, 256)
CONTEXTS = (1024, 2048, 4096)
SPLITS = (1, 2, 4, 8, 16, 32)
ENGINE_MAX_CONTEXT = 131072


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv-cache-dtype", default="auto,fp8")
    args = ap.parse_args()
    for name in args.kv_cache_dtype.split(","):
        kv_dtype = resolve_kv_dtype(name, torch.bfloat16)
        eight_bit = kv_dtype != torch.bfloat16
        summary = []
        for batch in BATCHES:
            launch = decode_launch(HEAD_DIM, eight_bit, batch)
            current = num_kv_splits(
                batch, NUM_KV_HEADS, ENGINE_MAX_CONTEXT, launch.block_n, torch.device("cuda")
            )
            for context in CONTEXTS:
                q, k, v, meta, (ks, vs) = paged_inputs(
                    [context] * batch, [1] * batch, True, kv_dtype
                )
                if eight_bit and fp8_v_slots_inner():
                    v = to_slots_inner(v)
                times = {}
                for splits in SPLITS:
                    run = functools.partial(
                        paged_decode, q, k, v, meta.seq_lens, meta.block_tables,
                        HEAD_DIM**-0.5, num_splits=splits, launch=launch, k_scale=ks, v_scale=vs,
                    )  # fmt: skip
                    times[splits] = median_ms(run)
                best = min(times, key=times.get)
                row = {
                    "kv": name,
                    "batch": batch,
                    "context": context,
                    "current": current,
                    "ms": {str(s): round(t, 4) for s, t in times.items()},
                    "best": best,
                    "current_vs_best": round(times[current] / times[best], 3)
                    if current in times
                    else None,
                }
                print(json.dumps(row), flush=True)
                summary.append(row)
        print(
            json.dumps(
                {
                    "summary": "decode splits",
                    "kv": name,
                    "git_commit": git_commit(),
                    "best": {f"{r['batch']}x{r['context']}": r["best"] for r in summary},
                }
            )
        )


if __name__ == "__main__":
    main()
