"""The FP8 activation kernels' one- and two-pass forms against each other (GPU).

    PYTHONPATH=. python scripts/bench_fp8_fused.py

For T rows of the 8B shape: fused.silu_and_mul (bf16 out) beside silu_and_mul_fp8 in each of its
forms (two passes over 2,048-wide runs, the whole 14,336-wide row in one tile, split: a
program per 2,048-wide chunk of every row, in two launches, stash: split with the values kept
between its launches, and staged: the bf16 op, then the quantizer; names ending _hw with the
e4m3 rounding left to the cast, fp8_kernels.HW_ROUNDING); and fp8_kernels.quantize_rows of a
4,096-wide row (the attention output, o_proj's input) both ways.
Median microseconds each, and whether the two forms gave the same bits. One JSON line per T; the
last line says which form won at every T (fp8_fused.default_silu_form and
fp8_kernels.ONE_PASS_MAX_ROWS should follow it). Each time is per call of LAYERS calls over their
own inputs, back to back in one CUDA graph (bench_attention.steps_us), as a step's layers run
them: until 2026-12-01 they were timed eagerly one call at a time, which at these 5-80 us is
the launch's host time (split, two launches, read 73 us at 32 rows against one pass's 13; in
blog FP8 the split form was the faster by 3 us a layer).
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import torch
from bench_attention import steps_us

from bulkgen.model import fused
from bulkgen.model.fp8_fused import silu_and_mul_fp8
from bulkgen.model.fp8_kernels import quantize_rows
from bulkgen.model.switches import HW_ROUNDING_ENV

WIDTH, HIDDEN = 14336, 4096
FORMS = {
    "silu": ("silu_fp8_two_pass", "silu_fp8_one_pass", "silu_fp8_split", "silu_fp8_staged")
    + ("silu_fp8_stash", "silu_fp8_split_hw", "silu_fp8_staged_hw", "silu_fp8_stash_hw"),
    "quantize": ("quantize_two_pass", "quantize_one_pass", "quantize_one_pass_hw"),
}
LAYERS = 32  # calls a timed graph replays, each over its own input
# Decode batches, then steps with prefill (8,192 tokens: the default --max-batch-tokens); from
# 4,096 rows a graph replays LAYERS // 4 calls (32 inputs of 8,192 x 28,672 would take 15 GB).
ROWS = (1, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def layers_us(fn, inputs: list) -> float:
    """Microseconds per call of fn over each of inputs, in one CUDA graph."""
    return steps_us([functools.partial(fn, x) for x in inputs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", help="only these SiLU forms (a list), beside the bf16 op")
    parser.add_argument("--rows", help="a list of row counts (default: ROWS)")
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")] if args.rows else ROWS
    if args.forms:
        for rows in rows_list:
            print(json.dumps(forms_line(rows, args.forms.split(","))), flush=True)
        return
    wins = {kernel: {} for kernel in FORMS}
    for rows in rows_list:
        calls = LAYERS if rows < 4096 else LAYERS // 4
        gate_ups = [
            torch.randn(rows, 2 * WIDTH, device="cuda", dtype=torch.bfloat16) * 4
            for _ in range(calls)
        ]
        xs = [torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16) * 4 for _ in gate_ups]
        gate_up, x = gate_ups[0], xs[0]
        one = silu_and_mul_fp8(gate_up, form="one_pass")
        two, split = silu_and_mul_fp8(gate_up, "two_pass"), silu_and_mul_fp8(gate_up, "split")
        q_one, q_two = quantize_rows(x, one_pass=True), quantize_rows(x, one_pass=False)
        staged, stash = silu_and_mul_fp8(gate_up, "staged"), silu_and_mul_fp8(gate_up, "stash")
        same = same_bits(one, two) and same_bits(one, split) and same_bits(one, staged)
        same = same and same_bits(one, stash)
        same = same and same_bits(q_one, q_two)
        times = {
            "silu_bf16": layers_us(fused.silu_and_mul, gate_ups),
            "silu_fp8_two_pass": layers_us(lambda g: silu_and_mul_fp8(g, "two_pass"), gate_ups),
            "silu_fp8_one_pass": layers_us(lambda g: silu_and_mul_fp8(g, "one_pass"), gate_ups),
            "silu_fp8_split": layers_us(lambda g: silu_and_mul_fp8(g, "split"), gate_ups),
            "silu_fp8_staged": layers_us(lambda g: silu_and_mul_fp8(g, "staged"), gate_ups),
            "silu_fp8_stash": layers_us(lambda g: silu_and_mul_fp8(g, "stash"), gate_ups),
            "quantize_two_pass": layers_us(lambda x: quantize_rows(x, one_pass=False), xs),
            "quantize_one_pass": layers_us(lambda x: quantize_rows(x, one_pass=True), xs),
        }
        os.environ[HW_ROUNDING_ENV] = "1"  # fp8_kernels.HW_ROUNDING: the rounding left to the cast
        hw = silu_and_mul_fp8(gate_up, "stash"), quantize_rows(x, one_pass=True)
        times["silu_fp8_split_hw"] = layers_us(lambda g: silu_and_mul_fp8(g, "split"), gate_ups)
        times["silu_fp8_staged_hw"] = layers_us(lambda g: silu_and_mul_fp8(g, "staged"), gate_ups)
        times["silu_fp8_stash_hw"] = layers_us(lambda g: silu_and_mul_fp8(g, "stash"), gate_ups)
        times["quantize_one_pass_hw"] = layers_us(lambda x: quantize_rows(x, one_pass=True), xs)
        del os.environ[HW_ROUNDING_ENV]
        same = same and same_bits(one, hw[0]) and same_bits(q_one, hw[1])
        for kernel, forms in FORMS.items():
            wins[kernel][rows] = min(forms, key=times.__getitem__)
        row = {"rows": rows, **{k: round(v, 1) for k, v in times.items()}, "same_bits": same}
        print(json.dumps(row), flush=True)
    print(json.dumps({"summary": "fp8 activation kernels", "faster": wins}), flush=True)


def forms_line(rows: int, forms: list[str]) -> dict:
    """Microseconds a call of the bf16 op and each of forms at rows x WIDTH, and the share of
    values (and of rows' scales) each form puts elsewhere than the first form does (0.0: the same
    bits)."""
    calls = LAYERS if rows < 4096 else LAYERS // 4
    gate_ups = [
        torch.randn(rows, 2 * WIDTH, device="cuda", dtype=torch.bfloat16) * 4 for _ in range(calls)
    ]
    first = silu_and_mul_fp8(gate_ups[0], forms[0])
    line = {"rows": rows, "silu_bf16": round(layers_us(fused.silu_and_mul, gate_ups), 1)}
    for form in forms:
        line[f"silu_fp8_{form}"] = round(
            layers_us(functools.partial(silu_and_mul_fp8, form=form), gate_ups), 1
        )
        out = silu_and_mul_fp8(gate_ups[0], form)
        differ = (out[0].view(torch.uint8) != first[0].view(torch.uint8)).float().mean().item()
        line[f"differ_{form}"] = differ
        line[f"scales_differ_{form}"] = (out[1] != first[1]).float().mean().item()
    return line


def same_bits(a, b) -> bool:
    """Two (fp8 values, scales) results hold the same bits."""
    return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


if __name__ == "__main__":
    main()
