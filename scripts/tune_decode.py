"""Sweep the decode kernel's launch choices (splits, warps, stages) at the 8B attention shape.

    PYTHONPATH=. python scripts/tune_decode.py

One JSON line per (batch, context): the best setting and its KV bandwidth next to the default's.
"""

from __future__ import annotations

import functools
import itertools
import json

import torch
from bench_attention import HEAD_DIM, median_ms, paged_inputs

from bulkgen.model.attention.triton_decode import paged_decode


def main() -> None:
    for batch, context in itertools.product((32, 128, 256), (512, 1280, 4096)):
        q, k, v, meta = paged_inputs([context] * batch, [1] * batch, decode_only=True)
        kv_bytes = 2 * k.element_size() * batch * context * 8 * HEAD_DIM
        results = []
        for splits, warps, stages in itertools.product((1, 2, 4, 8, 16), (4, 8), (2, 3, 4)):
            try:
                args = (q, k, v, meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5)
                ms = median_ms(functools.partial(paged_decode, *args, splits, warps, stages))
            except Exception as e:  # a setting the compiler refuses (shared memory): skip it
                print(json.dumps({"skip": [splits, warps, stages], "error": repr(e)[:200]}))
                continue
            results.append((ms, splits, warps, stages))
        best = min(results)
        print(
            json.dumps(
                {
                    "batch": batch,
                    "context": context,
                    "best": {
                        "splits": best[1],
                        "warps": best[2],
                        "stages": best[3],
                        "ms": round(best[0], 4),
                        "gbs": round(kv_bytes / best[0] / 1e6, 1),
                    },
                    "all": [[round(r[0], 4), *r[1:]] for r in sorted(results)[:6]],
                }
            ),
            flush=True,
        )
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
