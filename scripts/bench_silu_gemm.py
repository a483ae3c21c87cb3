"""gate_up and the SiLU as a decode step runs them, fused (fp8_gemm_silu.py: the SiLU in gate_up's
epilogue, then the stash form's quantizer) against unfused (gate_up through the table's launch,
then silu_and_mul_fp8), at the 8B shape: does the fused launch save what it should (the SiLU's
first launch, about half of its 5.3 us a layer at 32 rows) without slowing the GEMM? (GPU)

    PYTHONPATH=.:scripts python scripts/bench_silu_gemm.py [--rows 1,16,32,64,128]

32 layers in one CUDA graph, each on its own gate_up weight (bench_attention.steps_us: no L2 clear,
the weights larger than the L2 together), fast accumulation as the engine runs FP8. One JSON line
per row count: microseconds a layer each way, the fused launch's tiles, and whether its e4m3 rows
and scales equal the unfused ones (the same tiles, so they should, bit for bit).
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
from bulkgen.model.fp8_gemm_silu import fused_config, gate_up_silu_rows
from bulkgen.model.fp8_gemm_table import fp8_matmul, tile_counters_needed
from bulkgen.model.fp8_silu_split import quantize_stashed

N, K, LAYERS = 28672, 4096, 32


def unfused(x: Fp8Activation, weight, counters) -> Fp8Activation:
    gate_up = fp8_matmul(x.q, x.scale, *weight, counters, fast_accum=True)
    return silu_and_mul_fp8(gate_up)


def fused(x: Fp8Activation, weight, config) -> Fp8Activation:
    h, absmax = gate_up_silu_rows(x, *weight, config, fast_accum=True)
    q = torch.empty(h.shape, dtype=x.q.dtype, device=h.device)
    out = Fp8Activation(q, torch.empty((h.shape[0], 1), device=h.device))
    quantize_stashed(h, absmax, out.q, out.scale)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,16,32,64,128", help="row counts, commas")
    args = parser.parse_args()
    dev = torch.device("cuda")
    weights = [quantize_weight(torch.randn(N, K, device=dev) / K**0.5) for _ in range(LAYERS)]
    counters = torch.zeros(tile_counters_needed(N, K), dtype=torch.int32, device=dev)
    for m in [int(r) for r in args.rows.split(",")]:
        config = fused_config(N, K, m)
        line = {"bench": "silu_gemm", "M": m, "git_commit": git_commit()}
        if config is None:
            print(json.dumps(line | {"fused": None}), flush=True)
            continue
        x = Fp8Activation(*quantize_rows_reference(torch.randn(m, K, device=dev)))
        # The unfused GEMM with the fused launch's own tiles: the same sums, so the same bits.
        gate_up = fp8_gemm(x.q, x.scale, *weights[0], config, fast_accum=True)
        ref, out = silu_and_mul_fp8(gate_up, form="stash"), fused(x, weights[0], config)
        equal = torch.equal(out.q.view(torch.uint8), ref.q.view(torch.uint8))
        equal = equal and torch.equal(out.scale, ref.scale)
        before = steps_us([functools.partial(unfused, x, w, counters) for w in weights])
        after = steps_us([functools.partial(fused, x, w, config) for w in weights])
        tiles = f"m{config.block_m}n{config.block_n}k{config.block_k}p{config.num_stages}"
        line |= {"unfused_us": round(before, 2), "fused_us": round(after, 2)}
        line |= {"fused": tiles + "t" * config.swap_ab, "same_bits": equal}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
