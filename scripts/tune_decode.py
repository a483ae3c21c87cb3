"""Sweep the decode kernel's launch (tile, warps, stages, fp8 V conversion) at the 8B shape.

    PYTHONPATH=. python scripts/tune_decode.py --kv-cache-dtype fp8 [--write-table]

One JSON line per launch: its median time at each (batch, context), and the geometric mean over
them; then a summary line with the best launch, the current one and the bf16 kernel's time at the
same shapes (an fp8 cache reads half the bytes, so its ideal is half the bf16 time). Splits are
the engine's own choice for each tile size. --write-table stores the best launch for the cache
kind in bulkgen/model/attention/decode_tilings.json, which the engine reads (decode_launch).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
from bench_attention import DTYPE, HEAD_DIM, median_ms, paged_inputs
from bench_measure import git_commit

from bulkgen.model.attention.decode_tiling import TILINGS_FILE, DecodeLaunch, decode_launch
from bulkgen.model.attention.kv_fp8 import resolve_kv_dtype
from bulkgen.model.attention.triton_decode import paged_decode

SHAPES = [(batch, context) for batch in (32, 256, 512) for context in (1024, 2048)]
# At 00df254 (no v_in_registers yet) 8 warps lost everywhere and stages 4 equalled the default;
# v_in_registers changes the registers a thread needs (scripts/kernel_resources.py), so both
# warp counts stay in; it matters for fp8 only. 24 fp8 launches, about 2 minutes on the H200.
BLOCK_NS, WARPS, STAGES, V_IN_REGISTERS = (64, 128, 256), (4, 8), (None, 2), (False, True)


def time_launch(inputs: dict, launch: DecodeLaunch) -> list[float] | None:
    """Median ms at each shape, or None when the compiler refuses the launch."""
    times = []
    for q, k, v, meta in inputs.values():
        args = (q, k, v, meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5)
        try:
            times.append(median_ms(lambda a=args: paged_decode(*a, launch=launch)))
        except Exception as e:  # e.g. out of shared memory: not a candidate
            print(json.dumps({"skip": launch._asdict(), "error": repr(e)[:200]}), flush=True)
            return None
    return times


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-cache-dtype", default="fp8", help="fp8 (the tuned one) or auto")
    ap.add_argument("--write-table", action="store_true", help="store the best launch")
    args = ap.parse_args()
    kv_dtype = resolve_kv_dtype(args.kv_cache_dtype, DTYPE)
    fp8 = args.kv_cache_dtype == "fp8"

    def shapes(dtype) -> dict:
        return {s: paged_inputs([s[1]] * s[0], [1] * s[0], True, dtype) for s in SHAPES}

    bf16_times = time_launch(shapes(DTYPE), decode_launch(HEAD_DIM, fp8=False))
    torch.cuda.empty_cache()
    inputs = shapes(kv_dtype)
    current = decode_launch(HEAD_DIM, fp8)
    results = []
    sweep = itertools.product(BLOCK_NS, WARPS, STAGES, V_IN_REGISTERS if fp8 else (False,))
    for block_n, warps, stages, v_in_registers in sweep:
        launch = DecodeLaunch(block_n, warps, stages, v_in_registers)
        times = time_launch(inputs, launch)
        if times is None:
            continue
        results.append((geomean(times), launch, times))
        row = {"launch": launch._asdict(), "geomean_ms": round(results[-1][0], 4)}
        print(json.dumps({**row, "ms": dict(zip(map(str, SHAPES), times, strict=True))}))
    best = min(results, key=lambda r: r[0])
    now = next((r for r in results if r[1] == current), None)
    summary = {
        "summary": "decode_launch",
        "kv_cache_dtype": args.kv_cache_dtype,
        "best": best[1]._asdict(),
        "best_geomean_ms": round(best[0], 4),
        "current": current._asdict(),
        "current_geomean_ms": round(now[0], 4) if now else None,
        "bf16_geomean_ms": round(geomean(bf16_times), 4),
        "best_vs_bf16": [round(t / b, 3) for t, b in zip(best[2], bf16_times, strict=True)],
        "shapes": [list(s) for s in SHAPES],
        "git_commit": git_commit(),
    }
    print(json.dumps(summary), flush=True)
    if args.write_table:
        table = json.loads(TILINGS_FILE.read_text()) if TILINGS_FILE.exists() else {}
        table.setdefault("launches", {}).setdefault(args.kv_cache_dtype, {})[str(HEAD_DIM)] = best[
            1
        ]._asdict()
        table["measured"] = (
            f"{torch.cuda.get_device_name()}, scripts/tune_decode.py at {summary['git_commit']}"
        )
        TILINGS_FILE.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
