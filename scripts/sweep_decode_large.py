"""The decode kernel's launches at trt's large batches (857 rows over an fp8 cache, 438 over
bf16, 1,500 tokens of context), where tune_decode.py's table (tuned at 32-512 rows of 1K and 2K)
is extrapolated: one JSON line per launch with its microseconds a launch (steps_us over copies
that outgrow the L2) and the K/V bytes it read per second.

    PYTHONPATH=.:scripts python scripts/sweep_decode_large.py [--rows 857] [--context 1500]
        [--kind fp8] [--mma] [--block-ns 64,128,256] [--warps 4,8] [--stages 2,3,4]
        [--registers 0,96] [--heads-first] [--k-layouts rows,heads_outer]

--mma adds each fp8 launch on e4m3 products (decode_mma.py, BULKGEN_FP8_DECODE_MMA=1);
--registers the register bounds to time each launch at (DecodeLaunch.max_registers; 0: none);
--heads-first each launch also with the grid's kv heads varying fastest (DecodeLaunch.heads_first);
--k-layouts rows,heads_outer each also over the same keys stored heads outer (kv_layout.py).
The launches are the product of the lists, prefetching block ids and not, after the table's own.
On the H200 at 0c16a4e (857 x 1,500, fp8, all of the default lists, --mma): the table's launch
670.3 us, 128-token tiles with 3 stages prefetched 639.8, e4m3 products 634.3 at best.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import tune_decode
from bench_attention import DTYPE, HEAD_DIM, NUM_KV_HEADS
from bench_commit import git_commit

from bulkgen.model.attention.decode_tiling import DecodeLaunch, decode_launch
from bulkgen.model.attention.kv_layout import to_heads_outer
from bulkgen.model.switches import DECODE_MMA_ENV

KINDS = {"fp8": torch.float8_e4m3fn, "bf16": DTYPE}


def launch_list(
    current: DecodeLaunch,
    block_ns: list[int],
    warps: list[int],
    stages: list[int],
    registers: list[int],
    heads_first: bool = False,
) -> list[DecodeLaunch]:
    """The table's launch first (and heads first, if asked), then the product of the lists, each
    with block ids prefetched and not (a register bound of 0: none), and heads first if asked."""
    orders = (False, True) if heads_first else (False,)
    launches = [current._replace(heads_first=first) for first in orders]
    return launches + [
        DecodeLaunch(
            block_n, w, st, prefetch_blocks=prefetch, max_registers=bound or None, heads_first=first
        )  # fmt: skip
        for block_n, w, st, prefetch, bound, first in itertools.product(
            block_ns, warps, stages, (False, True), registers, orders
        )
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=857)
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--kind", default="fp8", choices=sorted(KINDS))
    ap.add_argument("--mma", action="store_true")
    ap.add_argument("--block-ns", default="64,128,256")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--registers", default="0")
    ap.add_argument("--heads-first", action="store_true", help="each launch also heads first")
    ap.add_argument("--k-layouts", default="rows", help="rows, heads_outer (kv_layout.py)")
    args = ap.parse_args()
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    fp8 = args.kind == "fp8"
    tune_decode.SHAPES = [(args.rows, args.context)]
    rows_inputs = tune_decode.shapes(KINDS[args.kind], slots_inner=fp8)
    layouts = {"rows": rows_inputs}
    if "heads_outer" in args.k_layouts.split(","):  # the same caches, keys copied heads outer
        layouts["heads_outer"] = {
            shape: [(q, to_heads_outer(k), *rest) for q, k, *rest in copies]
            for shape, copies in rows_inputs.items()
        }
    layouts = {name: layouts[name] for name in args.k_layouts.split(",")}
    read = 2 * args.rows * args.context * NUM_KV_HEADS * HEAD_DIM * KINDS[args.kind].itemsize
    current = decode_launch(HEAD_DIM, fp8, args.rows, "fp8" if fp8 else "auto")
    lists = (ints(args.block_ns), ints(args.warps), ints(args.stages), ints(args.registers))
    launches = launch_list(current, *lists, heads_first=args.heads_first)
    commit = git_commit()
    mmas = (False, True) if args.mma and fp8 else (False,)
    for launch, mma, k_layout in itertools.product(launches, mmas, layouts):
        os.environ[DECODE_MMA_ENV] = "1" if mma else "0"
        times = tune_decode.time_launch(layouts[k_layout], launch)
        if times is None:
            continue
        us = times[0] * 1e3
        row = {"kind": args.kind, "rows": args.rows, "context": args.context, "mma": mma}
        row |= {"k_layout": k_layout}
        row |= {"launch": launch._asdict(), "current": launch == current, "us": round(us, 1)}
        row |= {"tb_per_s": round(read / us / 1e6, 3), "git_commit": commit}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
