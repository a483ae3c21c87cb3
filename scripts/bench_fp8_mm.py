"""FP8 GEMMs against bf16 at the 8B decoder's shapes, by batch size (GPU).

    PYTHONPATH=. python scripts/bench_fp8_mm.py [--rows 256,288,320,384,416,448,480,512]

For each projection (qkv, o, gate_up, down) and M rows: cuBLAS bf16 (x @ W.T), cuBLASLt's FP8
GEMM (torch._scaled_mm with rowwise scales) and the same with use_fast_accum, and the FP8 GEMM
Fp8Linear dispatches to ("fp8_table": _scaled_mm, or the Triton kernel where
bulkgen/model/fp8_gemm_table.json says so), median ms of each, and the per-step sum over the 32
layers. One JSON line per M: where FP8 loses to bf16 (small M, where a GEMM only streams the
weights) shows here, and with --rows at the decode graphs' batch sizes past 256, what a row
costs where the GEMMs are compute-bound (whether 441 rows, run as 448, cost as much as 512).
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from bulkgen.model.fp8 import quantize_weight
from bulkgen.model.fp8_gemm_table import fp8_matmul
from bulkgen.model.shapes import LLAMA3_8B

LAYERS = LLAMA3_8B["num_hidden_layers"]


def projections() -> dict[str, tuple[int, int]]:
    """name -> (N, K) of the decoder's projections."""
    h, i = LLAMA3_8B["hidden_size"], LLAMA3_8B["intermediate_size"]
    kv = LLAMA3_8B["num_key_value_heads"] * h // LLAMA3_8B["num_attention_heads"]
    return {"qkv": (h + 2 * kv, h), "o": (h, h), "gate_up": (2 * i, h), "down": (h, i)}


def median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1,8,32,64,128,256,512,1024,2048", help="M values, commas")
    args = ap.parse_args()
    dev = torch.device("cuda")
    weights = {}
    for name, (n, k) in projections().items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        weights[name] = (w, *quantize_weight(w))
    for m in [int(r) for r in args.rows.split(",")]:
        row = {"M": m}
        totals = {"bf16": 0.0, "fp8": 0.0, "fp8_fast_accum": 0.0, "fp8_table": 0.0}
        for name, (w, wq, w_scale) in weights.items():
            x = torch.randn(m, w.shape[1], device=dev, dtype=torch.bfloat16)
            xq, x_scale = quantize_weight(x)  # per-row scales, as the activations get
            x_scale = x_scale.view(-1, 1)
            args = dict(scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=torch.bfloat16)
            times = {
                "bf16": median_ms(lambda x=x, w=w: x @ w.t()),
                "fp8": median_ms(lambda xq=xq, wq=wq, a=args: torch._scaled_mm(xq, wq.t(), **a)),
                "fp8_fast_accum": median_ms(
                    lambda xq=xq, wq=wq, a=args: torch._scaled_mm(
                        xq, wq.t(), use_fast_accum=True, **a
                    )
                ),
                "fp8_table": median_ms(lambda x=(xq, x_scale, wq, w_scale): fp8_matmul(*x)),
            }
            row[name] = {k: round(v * 1000, 1) for k, v in times.items()}  # microseconds
            for k, v in times.items():
                totals[k] += LAYERS * v
        row["step_ms"] = {k: round(v, 3) for k, v in totals.items()}
        row["step_us_per_row"] = {k: round(1000 * v / m, 2) for k, v in totals.items()}
        row["fp8_vs_bf16"] = round(totals["bf16"] / totals["fp8"], 3)
        row["fast_accum_vs_bf16"] = round(totals["bf16"] / totals["fp8_fast_accum"], 3)
        row["table_vs_bf16"] = round(totals["bf16"] / totals["fp8_table"], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
