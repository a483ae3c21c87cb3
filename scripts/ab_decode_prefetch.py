"""The decode kernel with each tile's block ids loaded ahead (DecodeLaunch.prefetch_blocks)
against the engine's own launch, at the 8B shape, in CUDA graphs (graph_ms: L2 cleared before
each replay), for a bf16 and an fp8 cache (values slots inner in 64-token blocks, as the engine
allocates them) at blog's 32 rows and at 256 and 512 rows:

    PYTHONPATH=. python scripts/ab_decode_prefetch.py

One JSON line per (cache, rows, context): the engine's launch and its ms, then each variant's ms
and its ratio to the engine's (below 1: faster). Compiled for sm_90, the engine's launches wait
for every copy at each tile (one tile in flight); loaded ahead, 3 stages keep 2 groups in flight
and 4 keep 4 (compile_check_attention.py's "copy waits"). Also the bytes each launch reads per
second (K and V of every row's context, once).
"""

from __future__ import annotations

import json

import torch
from bench_attention import HEAD_DIM, NUM_KV_HEADS, graph_ms, paged_inputs
from bench_commit import git_commit

from bulkgen.model.attention.decode_tiling import decode_launch, fp8_v_slots_inner
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE
from bulkgen.model.attention.kv_layout import block_size_for, to_slots_inner
from bulkgen.model.attention.triton_decode import paged_decode

SHAPES = [(32, 1408), (32, 2048), (256, 2048), (512, 2048)]
STAGES = (3, 4)
# At 32 rows a program's tiles in flight may move the best split count (tune_decode.py's split
# sweep decides for the table); timed here with 3 stages.
SMALL_BATCH_SPLITS = (1, 2, 4, 8)


def main() -> None:
    for kv_dtype in (torch.bfloat16, FP8_DTYPE):
        fp8 = kv_dtype == FP8_DTYPE
        slots_inner = fp8 and fp8_v_slots_inner()
        for rows, context in SHAPES:
            torch.cuda.empty_cache()
            q, k, v, meta, _ = paged_inputs(
                [context] * rows, [1] * rows, True, kv_dtype, block_size_for(slots_inner)
            )
            if slots_inner:
                v = to_slots_inner(v)
            args = (q, k, v, meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5)
            engine = decode_launch(HEAD_DIM, fp8, rows, "fp8" if fp8 else "auto")
            base = graph_ms(lambda a=args, launch=engine: paged_decode(*a, launch=launch))
            variants = {}
            tried = {f"prefetch_stages{n}": {"num_stages": n} for n in STAGES}
            if rows <= 32:  # the engine's launch at other split counts too, for comparison
                for n in SMALL_BATCH_SPLITS:
                    tried[f"prefetch_stages3_splits{n}"] = {"num_stages": 3, "splits": n}
                    tried[f"engine_splits{n}"] = {"splits": n, "prefetch_blocks": False}
            for name, fields in tried.items():
                launch = engine._replace(**{"prefetch_blocks": True, **fields})
                try:
                    ms = graph_ms(lambda a=args, launch=launch: paged_decode(*a, launch=launch))
                except Exception as e:  # e.g. out of shared memory: not a candidate
                    variants[name] = repr(e)[:120]
                    continue
                variants[name] = {"ms": round(ms, 4), "ratio": ms / base}
            kv_bytes = 2 * rows * context * NUM_KV_HEADS * HEAD_DIM * k.element_size()
            line = {
                "cache": "fp8" if fp8 else "bf16",
                "rows": rows,
                "context": context,
                "engine_launch": engine._asdict(),
                "engine_ms": round(base, 4),
                "engine_tb_per_s": round(kv_bytes / base / 1e9, 2),
                **variants,
                "git_commit": git_commit(),
            }
            for value in line.values():
                if isinstance(value, dict) and "ratio" in value:
                    value["ratio"] = round(value["ratio"], 3)
            print(json.dumps(line), flush=True)
            del q, k, v, meta


if __name__ == "__main__":
    main()
