"""gate_up and the SiLU as a decode step runs them, fused (fp8_gemm_silu.py: the SiLU in gate_up's
epilogue, then the stash form's quantizer) against unfused (gate_up through the table's launch,
then silu_and_mul_fp8), at the 8B shape: does the fused launch save what it should (the SiLU's
first launch, about half of its 5.3 us a layer at 32 rows) without slowing the GEMM? (GPU)

    PYTHONPATH=.:scripts python scripts/bench_silu_gemm.py [--rows 1,16,32,64,128]
    PYTHONPATH=.:scripts python scripts/bench_silu_gemm.py --tune [--write-table]

32 layers in one CUDA graph, each on its own gate_up weight (bench_attention.steps_us: no L2 clear,
the weights larger than the L2 together), fast accumulation as the engine runs FP8. One JSON line
per row count: microseconds a layer each way, the fused launch's tiles, and whether its e4m3 rows
and scales equal the unfused ones (the same tiles, so they should, bit for bit).

--tune times every pointer launch without K splits (fp8_gemm.CANDIDATES, tiles no taller than
the rows need, accumulators that fit: too_wide) fused, against the unfused pair, and keeps the
fastest per row count ("unfused" where the pair wins); --write-table stores the choices under
fp8_gemm_table.json's "silu" (the rest of the table as it was), which fused_config then follows
instead of deriving a launch.
A launch whose rows differ from the unfused ops' with its own tiles is reported, never chosen.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from bench_attention import steps_us
from bench_commit import git_commit

from bulkgen.model.fp8 import Fp8Activation, quantize_rows_reference, quantize_weight
from bulkgen.model.fp8_fused import silu_and_mul_fp8
from bulkgen.model.fp8_gemm import fp8_gemm
from bulkgen.model.fp8_gemm_silu import fused_config, fused_rows
from bulkgen.model.fp8_gemm_table import (
    TABLE_FILE,
    UNFUSED,
    buckets_from_winners,
    fp8_matmul,
    tile_counters_needed,
)

N, K, LAYERS = 28672, 4096, 32


def unfused(x: Fp8Activation, weight, counters) -> Fp8Activation:
    gate_up = fp8_matmul(x.q, x.scale, *weight, counters, fast_accum=True)
    return silu_and_mul_fp8(gate_up)


def fused(x: Fp8Activation, weight, config) -> Fp8Activation:
    return fused_rows(x, *weight, config, fast_accum=True)


def same_bits(x: Fp8Activation, weight, config) -> bool:
    """The fused launch's rows and scales are the unfused ops' with its own tiles."""
    gate_up = fp8_gemm(x.q, x.scale, *weight, config, fast_accum=True)
    ref, out = silu_and_mul_fp8(gate_up, form="stash"), fused(x, weight, config)
    return torch.equal(out.q.view(torch.uint8), ref.q.view(torch.uint8)) and torch.equal(
        out.scale, ref.scale
    )


def too_wide(config) -> bool:
    """A fused program holds a gate and an up accumulator: more than 128 float32 registers a
    thread for them (m128n256 on 8 warps: 256) spills, so such launches are not timed."""
    return 2 * config.block_m * config.block_n > 128 * 32 * config.num_warps


def tune(rows: list[int], weights, counters, write: bool) -> None:
    """The fastest fused launch per row count against the unfused pair (module docstring)."""
    from tune_fp8_mm import candidates_for

    winners = {}
    for m in rows:
        x = Fp8Activation(*quantize_rows_reference(torch.randn(m, K, device=weights[0][0].device)))
        us = {UNFUSED: steps_us([functools.partial(unfused, x, w, counters) for w in weights])}
        wrong = []
        for name, config in candidates_for(m).items():
            if config.split_k > 1 or config.tma or config.dot != "fp8" or too_wide(config):
                continue
            try:
                if not same_bits(x, weights[0], config):
                    wrong.append(f"{name}: differs from the unfused ops")
                    continue
            except Exception as e:  # a launch the GPU refuses (resources): report, skip
                wrong.append(f"{name}: {type(e).__name__}: {str(e)[:120]}")
                continue
            us[name] = steps_us([functools.partial(fused, x, w, config) for w in weights])
        winners[m] = min(us, key=us.get)
        line = {"bench": "silu_tune", "M": m, "best": winners[m], "git_commit": git_commit()}
        line["us"] = {c: round(t, 2) for c, t in sorted(us.items(), key=lambda kv: kv[1])}
        print(json.dumps(line | ({"refused": wrong} if wrong else {})), flush=True)
    if write:
        table = json.loads(TABLE_FILE.read_text())
        table.setdefault("silu", {})[f"{N}x{K}"] = buckets_from_winners(winners)
        table["silu_measured"] = {"commit": git_commit(), "device": torch.cuda.get_device_name()}
        TABLE_FILE.write_text(json.dumps(table, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,16,32,64,128", help="row counts, commas")
    parser.add_argument("--tune", action="store_true", help="time every fused launch")
    parser.add_argument("--write-table", action="store_true", help="with --tune: store them")
    args = parser.parse_args()
    dev = torch.device("cuda")
    weights = [quantize_weight(torch.randn(N, K, device=dev) / K**0.5) for _ in range(LAYERS)]
    counters = torch.zeros(tile_counters_needed(N, K), dtype=torch.int32, device=dev)
    rows = [int(r) for r in args.rows.split(",")]
    if args.tune:
        return tune(rows, weights, counters, args.write_table)
    for m in rows:
        config = fused_config(N, K, m)
        line = {"bench": "silu_gemm", "M": m, "git_commit": git_commit()}
        if config is None:
            print(json.dumps(line | {"fused": None}), flush=True)
            continue
        x = Fp8Activation(*quantize_rows_reference(torch.randn(m, K, device=dev)))
        equal = same_bits(x, weights[0], config)
        before = steps_us([functools.partial(unfused, x, w, counters) for w in weights])
        after = steps_us([functools.partial(fused, x, w, config) for w in weights])
        tiles = f"m{config.block_m}n{config.block_n}k{config.block_k}p{config.num_stages}"
        line |= {"unfused_us": round(before, 2), "fused_us": round(after, 2)}
        line |= {"fused": tiles + "t" * config.swap_ab, "same_bits": equal}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
