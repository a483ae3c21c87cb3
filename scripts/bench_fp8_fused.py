"""silu_and_mul_fp8's two kernels against each other and the bf16 silu_and_mul (GPU).

    PYTHONPATH=. python scripts/bench_fp8_fused.py

At the 8B shape's width (gate and up of 14,336), for T rows: fused.silu_and_mul (bf16 out), and
silu_and_mul_fp8 with two passes over 2,048-wide runs and with the whole row in one tile
(one_pass), median microseconds each, and whether the two FP8 kernels gave the same bits. One
JSON line per T; the last line says which FP8 kernel won at every T (fp8_fused.ONE_PASS's
default should follow it).
"""

from __future__ import annotations

import json

import torch
from triton.testing import do_bench

from bulkgen.model import fused
from bulkgen.model.fp8_fused import silu_and_mul_fp8

WIDTH = 14336


def median_us(fn) -> float:
    return 1000 * do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    wins = {}
    for rows in (1, 32, 128, 256, 512, 1024):
        gate_up = torch.randn(rows, 2 * WIDTH, device="cuda", dtype=torch.bfloat16) * 4
        one, two = silu_and_mul_fp8(gate_up, one_pass=True), silu_and_mul_fp8(gate_up, False)
        same = torch.equal(one.q.view(torch.uint8), two.q.view(torch.uint8)) and torch.equal(
            one.scale, two.scale
        )
        times = {
            "bf16": median_us(lambda g=gate_up: fused.silu_and_mul(g)),
            "fp8_two_pass": median_us(lambda g=gate_up: silu_and_mul_fp8(g, one_pass=False)),
            "fp8_one_pass": median_us(lambda g=gate_up: silu_and_mul_fp8(g, one_pass=True)),
        }
        wins[rows] = min(("fp8_two_pass", "fp8_one_pass"), key=times.__getitem__)
        row = {"rows": rows, **{k: round(v, 1) for k, v in times.items()}, "same_bits": same}
        print(json.dumps(row), flush=True)
    print(json.dumps({"summary": "silu_and_mul_fp8", "faster": wins}), flush=True)


if __name__ == "__main__":
    main()
