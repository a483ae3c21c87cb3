"""The rotary and KV write inside the decode launch (decode_rotary.py) against rotary_write's
launch then the decode launch, by rows a step: which batch sizes gain (decode_rotary.MAX_ROWS).
Each side runs 32 layers (each over its own caches) back to back in one CUDA graph, at the 8B
attention shape, the engine's launches (decode_tilings.json) and split counts, contexts of
CONTEXT tokens, bf16 and fp8 caches; no L2 clear between replays (bench_decode_layers.py's way).

    PYTHONPATH=. python scripts/bench_decode_rotary.py [--rows 1,8,32,64,128,256,512]
        [--context 1024] [--caches bf16,fp8]

One JSON line per (cache, rows): microseconds per layer apart and in one launch, and their ratio
(fused_over_apart < 1: the one launch is faster). A graph's launches back to back are not a
step: in a step the GEMMs before and after overlap the attention launches' heads and tails.
"""

from __future__ import annotations

import argparse
import functools
import json

import bench_attention
import torch
from bench_attention import HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, paged_inputs, steps_us
from bench_commit import git_commit

from bulkgen.model.attention.decode_rotary import Unrotated
from bulkgen.model.attention.decode_tiling import decode_launch, fp8_v_slots_inner
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE
from bulkgen.model.attention.kv_layout import block_size_for, to_slots_inner
from bulkgen.model.attention.rotary_write import rotary_write_kv
from bulkgen.model.attention.triton_decode import paged_decode

LAYERS = 32
CACHES = {"bf16": torch.bfloat16, "fp8": FP8_DTYPE}


def layer_inputs(rows: int, context: int, kv_dtype) -> tuple:
    """One layer's (Unrotated step, k_cache, v_cache, seq_lens, block_tables)."""
    slots_inner = kv_dtype == FP8_DTYPE and fp8_v_slots_inner()
    block_size = block_size_for(slots_inner)
    _, k_cache, v_cache, meta, _ = paged_inputs([context] * rows, [1] * rows, True, kv_dtype,
                                                block_size)  # fmt: skip
    v_cache = to_slots_inner(v_cache) if slots_inner else v_cache
    width = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    device = bench_attention.DEVICE
    qkv = torch.randn(rows, width, dtype=torch.bfloat16, device=device)
    parts = qkv.split(
        [NUM_Q_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM], -1
    )
    q, k, v = (x.view(rows, -1, HEAD_DIM) for x in parts)
    positions = meta.seq_lens.long() - 1
    rows_at = torch.arange(rows, device=device)
    blocks = meta.block_tables[rows_at, positions // block_size].long()
    slots = blocks * block_size + positions % block_size
    angles = torch.rand(context + 1, HEAD_DIM // 2, device=device) * 6.0
    step = Unrotated(q, k, v, positions, angles.cos(), angles.sin(), slots)
    return step, k_cache, v_cache, meta.seq_lens, meta.block_tables


def apart(step, k_cache, v_cache, seq_lens, tables, launch):
    q = rotary_write_kv(step.q, step.k, step.v, step.positions, step.cos, step.sin, k_cache,
                        v_cache, step.slot_mapping)[0]  # fmt: skip
    return paged_decode(q, k_cache, v_cache, seq_lens, tables, HEAD_DIM**-0.5, launch=launch)


def fused(step, k_cache, v_cache, seq_lens, tables, launch):
    return paged_decode(step.q, k_cache, v_cache, seq_lens, tables, HEAD_DIM**-0.5,
                        launch=launch, rotate=step)  # fmt: skip


def timed(calls: list) -> float:
    """steps_us (bench_attention.py): microseconds per call, the calls in one CUDA graph."""
    return steps_us(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32,64,128,256,512")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--caches", default="bf16,fp8", help=f"of {', '.join(CACHES)}")
    args = parser.parse_args()
    commit = git_commit()
    for name in args.caches.split(","):
        kv_dtype = CACHES[name]
        for rows in map(int, args.rows.split(",")):
            fp8 = kv_dtype == FP8_DTYPE
            launch = decode_launch(HEAD_DIM, fp8, rows, "fp8" if fp8 else "auto")
            layers = [layer_inputs(rows, args.context, kv_dtype) for _ in range(LAYERS)]
            us = {}
            for form in (apart, fused):
                calls = [functools.partial(form, *layer, launch) for layer in layers]
                us[form.__name__] = timed(calls)
            line = {"cache": name, "rows": rows, "context": args.context}
            line |= {f"{k}_us": round(v, 2) for k, v in us.items()}
            line["fused_over_apart"] = round(us["fused"] / us["apart"], 4)
            print(json.dumps({**line, "git_commit": commit}), flush=True)
            del layers
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
