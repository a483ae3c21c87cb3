"""Time cuBLASLt's FP8 GEMM (torch._scaled_mm) against each Triton launch of fp8_gemm.py at the 8B
decoder's projections and decode-sized row counts, and keep the fastest per shape and M (GPU).

    PYTHONPATH=. python scripts/tune_fp8_mm.py [--write-table [--merge]] [--rows 1,32]
        [--proj o,down]

Each GEMM is timed as a decode step runs it: inside a CUDA graph (no launch gaps, split-K's two
launches back to back), over enough copies of the weight (distinct tensors, one GEMM each, at
least 256 MB in all) that no weight is still in the 50 MB L2 when it is read again, as in a
model of 32 layers (bench_attention.steps_us: the median replay, no L2 clear, over the copies;
until 2026-12-02 do_bench's median, an L2 clear before each replay). A candidate whose output is
not _scaled_mm's within bf16 rounding is reported and never chosen. Both sum as the engine's FP8
GEMMs do by default (fp8_fast_accum: the tensor cores' own accumulator over all of K);
--exact-sums times the float32 sums of EngineConfig(fp8_fast_accum=False) instead, and the table
records which was timed.

One JSON line per (projection, M): microseconds of each kernel, the best, its speedup over
scaled_mm and the weight bandwidth it reached. Then one summary line per M: the step's 128
projection GEMMs (32 layers) with cuBLASLt alone against the best of each. --write-table writes
bulkgen/model/fp8_gemm_table.json (after each projection, so a run cut short keeps what it
measured), which Fp8Linear reads at its next start.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json

import torch
from bench_attention import steps_us
from bench_commit import git_commit
from bench_fp8_mm import LAYERS, projections

from bulkgen.model.fp8 import quantize_rows_reference, quantize_weight
from bulkgen.model.fp8_gemm import CANDIDATES, fp8_gemm, tile_counters_for
from bulkgen.model.fp8_gemm_table import (
    SCALED_MM,
    TABLE_FILE,
    fastest,
    merged_shapes,
    table_from_timings,
)

ROWS = (1, 8, 16, 32, 64, 128, 256, 512, 1024)
STREAM_BYTES = 256 * 2**20  # weight bytes a graph walks through: five times the H200's L2


def candidates_for(m: int) -> dict[str, object]:
    """Launches worth timing at m rows: row tiles no taller than m needs (16 at least), and from
    256 rows none shorter than 64 (16-row tiles there read the weight 16 times and more)."""
    tallest = max(16, 1 << (m - 1).bit_length())
    return {
        name: c
        for name, c in CANDIDATES.items()
        if c.block_m <= tallest and (m < 256 or c.block_m >= 64)
    }


FAST_ACCUM = True  # main() sets it from --exact-sums


def scaled_mm(xq, x_scale, wq, w_scale):
    return torch._scaled_mm(
        xq,
        wq.t(),
        scale_a=x_scale,
        scale_b=w_scale.view(1, -1),
        out_dtype=torch.bfloat16,
        use_fast_accum=FAST_ACCUM,
    )


def graph_us(gemm, x, weights) -> float:
    """Median microseconds of one GEMM, run once per weight copy inside one CUDA graph."""
    return steps_us([functools.partial(gemm, *x, *w) for w in weights])


def exact_product(xq, x_scale, wq, w_scale) -> torch.Tensor:
    """The float64 product of the dequantized operands: what every kernel rounds."""
    x = xq.double() * x_scale.double().view(-1, 1)
    return x @ (wq.double() * w_scale.double().view(-1, 1)).t()


def agrees(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> bool:
    """Every element within two bf16 steps of the exact product, plus twice _scaled_mm's (ref)
    largest error: Hopper's FP8 MMAs keep fewer bits than float32 inside each 32-deep step, so
    two correct kernels summing in other orders differ near zero by more than float32 rounding
    (at bd2b623 a bound relative to ref alone refused every candidate at 32 of gate_up's rows).
    A kernel that drops or repeats a K tile is off by a share of every output."""
    err = (out.double() - exact).abs()
    floor = 2 * (ref.double() - exact).abs().max()
    return bool((err <= 2.0**-7 * exact.abs() + floor).all())


def tune_projection(
    name: str, n: int, k: int, rows: list[int], dev: torch.device
) -> dict[int, dict[str, float]]:
    """{M: {kernel: seconds}} for one projection, printing a line per M."""
    copies = max(2, -(-STREAM_BYTES // (n * k)))
    weights = [quantize_weight(torch.randn(n, k, device=dev) / k**0.5) for _ in range(copies)]
    by_m = {}
    for m in rows:
        x = quantize_rows_reference(torch.randn(m, k, device=dev))
        ref = scaled_mm(*x, *weights[0])
        exact = exact_product(*x, *weights[0])
        us = {SCALED_MM: graph_us(scaled_mm, x, weights)}
        wrong = []
        for cand, config in candidates_for(m).items():
            # A launch adding its own K splits counts in zeros it leaves zero: a layer's own.
            gemm = functools.partial(
                fp8_gemm,
                config=config,
                tile_counters=tile_counters_for(m, n, config, dev),
                fast_accum=FAST_ACCUM,
            )
            try:
                out = gemm(*x, *weights[0])
            except Exception as e:  # a launch the GPU refuses (resources): report, skip
                wrong.append(f"{cand}: {type(e).__name__}: {str(e)[:120]}")
                continue
            if not agrees(out, ref, exact):
                wrong.append(f"{cand}: differs from scaled_mm")
                continue
            us[cand] = graph_us(gemm, x, weights)
        best = min(us, key=us.get)
        line = {"proj": name, "N": n, "K": k, "M": m, "best": best, "best_us": round(us[best], 1)}
        line["speedup"] = round(us[SCALED_MM] / us[best], 3)
        line["best_TB_s"] = round(n * k / us[best] / 1e6, 2)  # the weight's bytes only
        line["us"] = {c: round(t, 1) for c, t in sorted(us.items(), key=lambda kv: kv[1])}
        if wrong:
            line["refused"] = wrong
        print(json.dumps(line), flush=True)
        by_m[m] = {c: t / 1e6 for c, t in us.items()}
    return by_m


def write_table(timings: dict[str, dict[int, dict[str, float]]], base: dict | None = None) -> None:
    """TABLE_FILE from these timings; with base (the table as it was before this run, for
    --merge): base with these (shape, M) choices replaced (merged_shapes), this run recorded
    under "updates" beside the first measurement's commit."""
    today = datetime.date.today().isoformat()
    how = "scripts/tune_fp8_mm.py --write-table (median of CUDA-graph replays)"
    if base is not None:
        if base.get("fast_accum") != FAST_ACCUM:
            raise SystemExit(f"{TABLE_FILE} was timed with fast_accum {base.get('fast_accum')}")
        update = {"commit": git_commit(), "measured": today, "how": how + " --merge"}
        update["rows"] = {s: sorted(t) for s, t in timings.items()}
        table = base | {"shapes": merged_shapes(base["shapes"], fastest(timings))}
        table["updates"] = base.get("updates", []) + [update]
    else:
        table = {"device": torch.cuda.get_device_name(), "commit": git_commit(), "measured": today}
        table |= {"how": how, "fast_accum": FAST_ACCUM, "shapes": table_from_timings(timings)}
    TABLE_FILE.write_text(json.dumps(table, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-table", action="store_true", help=f"write {TABLE_FILE.name}")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="M values, commas")
    parser.add_argument("--proj", default="qkv,o,gate_up,down", help="projections, commas")
    parser.add_argument(
        "--exact-sums", action="store_true", help="time float32 sums (fp8_fast_accum=False)"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --write-table: replace only the measured (projection, M) choices",
    )
    args = parser.parse_args()
    global FAST_ACCUM
    FAST_ACCUM = not args.exact_sums
    rows = [int(r) for r in args.rows.split(",")]
    wanted = args.proj.split(",")
    if unknown := set(wanted) - set(projections()):
        parser.error(f"unknown projections {sorted(unknown)}: pick from {list(projections())}")
    shapes = {p: s for p, s in projections().items() if p in wanted}
    base = json.loads(TABLE_FILE.read_text()) if args.merge else None
    timings = {}
    for name, (n, k) in shapes.items():
        timings[f"{n}x{k}"] = tune_projection(name, n, k, rows, torch.device("cuda"))
        if args.write_table:
            write_table(timings, base)
    for m in rows:
        cublas = sum(t[m][SCALED_MM] for t in timings.values()) * LAYERS * 1000
        best = sum(min(t[m].values()) for t in timings.values()) * LAYERS * 1000
        summary = {
            "summary": "step GEMMs, ms",
            "M": m,
            "layers": LAYERS,
            "projections": list(shapes),
        }
        summary |= {"scaled_mm_ms": round(cublas, 3), "best_ms": round(best, 3)}
        print(json.dumps(summary | {"speedup": round(cublas / best, 3)}), flush=True)


if __name__ == "__main__":
    main()
