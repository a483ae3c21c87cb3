"""How much of a large decode step the GPU could overlap: decode attention (memory-bound) on one
stream beside the layer's GEMMs (compute-bound) on another, two halves of the batch in turn
(NanoFlow's and SGLang's two-batch overlap), against the engine's one stream.

At `trt`'s large batches the step is their sum: at 88d02a8 the FP8 cache's 857-row decode step
took 43.2 ms (median), about its attention's bytes at the copy rate (some 20 ms) plus its bf16
GEMMs' FLOPs at the clock it ran (some 23 ms). Overlapping the two would approach the larger of
them, if the H200 runs a memory-bound and a compute-bound kernel side by side at near their own
speeds. This measures that before anything is built, at the 8B shape, LAYERS layers each over
its own caches (contexts of CONTEXT tokens, every row), the engine's decode launches, bf16
GEMMs (qkv, o_proj, gate_up, down; the SiLU left out), in CUDA graphs:

- serial: the whole batch's attention then its GEMMs, layer by layer (the engine's order);
- halves: each half's attention then its GEMMs, one stream (what splitting costs alone);
- overlap: half A's attention then GEMMs on one stream while half B's GEMMs then attention run
  on another, joined after the last layer (no data flows between the parts: the schedule a
  real two-batch step would have, without its dependencies);
- attention and gemms: each part alone over the whole batch.

    PYTHONPATH=.:scripts python scripts/bench_overlap.py [--rows 438,857] [--context 1500]
        [--caches bf16,fp8] [--layers 4] [--carveouts 16,32,48]

--carveouts: the overlap form again with cuBLAS told to leave that many SMs free for the
attention beside it (torch._C._set_sm_carveout_experimental, set while the graph is captured),
each in `overlap_us_by_carveout`: run as launched (first column below) the two streams did not
share the GPU, so this asks whether partitioning the SMs makes them.

One JSON line per (cache, rows): microseconds per layer of each form, and overlap / serial
(below 1: overlap would pay) and overlap against the larger part alone (1: perfect overlap).
"""

from __future__ import annotations

import argparse
import json

import bench_attention
import torch
from bench_attention import HEAD_DIM, steps_us
from bench_commit import git_commit
from bench_decode_rotary import CACHES, layer_inputs

from bulkgen.model.attention.decode_tiling import decode_launch
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE
from bulkgen.model.attention.triton_decode import paged_decode

LAYERS = 4
HIDDEN, INTERMEDIATE = 4096, 14336
QKV = (32 + 2 * 8) * HEAD_DIM


class Layer:
    """One layer's caches and weights, and its two parts over rows [lo, hi) of the batch."""

    def __init__(self, rows: int, context: int, kv_dtype) -> None:
        device = bench_attention.DEVICE
        self.step, self.k, self.v, self.seq_lens, self.tables = layer_inputs(rows, context,
                                                                             kv_dtype)  # fmt: skip
        fp8 = kv_dtype == FP8_DTYPE
        self.kind = "fp8" if fp8 else "auto"
        self.fp8 = fp8

        def weight(out: int, inp: int) -> torch.Tensor:
            return torch.randn(out, inp, dtype=torch.bfloat16, device=device) * inp**-0.5

        self.w = [weight(QKV, HIDDEN), weight(HIDDEN, HIDDEN), weight(2 * INTERMEDIATE, HIDDEN),
                  weight(HIDDEN, INTERMEDIATE)]  # fmt: skip
        self.x = torch.randn(rows, HIDDEN, dtype=torch.bfloat16, device=device)
        self.h = torch.randn(rows, INTERMEDIATE, dtype=torch.bfloat16, device=device)

    def attention(self, lo: int, hi: int) -> torch.Tensor:
        launch = decode_launch(HEAD_DIM, self.fp8, hi - lo, self.kind)
        return paged_decode(self.step.q[lo:hi], self.k, self.v, self.seq_lens[lo:hi],
                            self.tables[lo:hi], HEAD_DIM**-0.5, launch=launch)  # fmt: skip

    def gemms(self, lo: int, hi: int) -> torch.Tensor:
        qkv, o, gate_up, down = self.w
        x, h = self.x[lo:hi], self.h[lo:hi]
        x.matmul(qkv.t()), x.matmul(o.t()), x.matmul(gate_up.t())
        return h.matmul(down.t())


def serial(layers: list[Layer], rows: int) -> None:
    for layer in layers:
        layer.attention(0, rows), layer.gemms(0, rows)


def halves(layers: list[Layer], rows: int) -> None:
    mid = rows // 2
    for layer in layers:
        for lo, hi in ((0, mid), (mid, rows)):
            layer.attention(lo, hi), layer.gemms(lo, hi)


def overlap(layers: list[Layer], rows: int, other: torch.cuda.Stream) -> None:
    mid, main = rows // 2, torch.cuda.current_stream()
    other.wait_stream(main)
    with torch.cuda.stream(other):
        for layer in layers:
            layer.gemms(mid, rows), layer.attention(mid, rows)
    for layer in layers:
        layer.attention(0, mid), layer.gemms(0, mid)
    main.wait_stream(other)


def attention(layers: list[Layer], rows: int) -> None:
    for layer in layers:
        layer.attention(0, rows)


def gemms(layers: list[Layer], rows: int) -> None:
    for layer in layers:
        layer.gemms(0, rows)


def timed(run) -> float:
    """Microseconds of one call of `run` (no arguments) in a CUDA graph (bench_attention's
    steps_us: the median of 20 replays); on the CPU it is run once instead and 0 returned."""
    if bench_attention.DEVICE.type != "cuda":
        run()
        return 0.0
    return steps_us([run])


def measure(layers: list[Layer], rows: int) -> dict:
    """Microseconds per layer of each form."""
    cuda = bench_attention.DEVICE.type == "cuda"
    other = torch.cuda.Stream() if cuda else None  # on the CPU the overlap runs as the halves
    forms = {
        "serial": lambda: serial(layers, rows),
        "halves": lambda: halves(layers, rows),
        "overlap": lambda: overlap(layers, rows, other) if cuda else halves(layers, rows),
        "attention": lambda: attention(layers, rows),
        "gemms": lambda: gemms(layers, rows),
    }
    return {name: timed(run) / len(layers) for name, run in forms.items()}


def with_carveout(sms: int | None, run) -> float:
    """timed(run) with cuBLAS's GEMMs leaving `sms` SMs free (None: all theirs)."""
    torch._C._set_sm_carveout_experimental(sms)
    try:
        return timed(run)
    finally:
        torch._C._set_sm_carveout_experimental(None)


def carveout_us(layers: list[Layer], rows: int, carveouts: list[int]) -> dict:
    """Microseconds per layer of the overlap form at each carveout (CUDA only)."""
    other = torch.cuda.Stream()
    run = lambda: overlap(layers, rows, other)  # noqa: E731
    return {sms: round(with_carveout(sms, run) / len(layers), 1) for sms in carveouts}


def summary(us: dict) -> dict:
    """The line's ratios: overlap against serial and against the larger part alone."""
    larger = max(us["attention"], us["gemms"])
    return {
        **{f"{k}_us": round(v, 1) for k, v in us.items()},
        "overlap_over_serial": round(us["overlap"] / us["serial"], 4) if us["serial"] else None,
        "overlap_over_larger_part": round(us["overlap"] / larger, 4) if larger else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="438,857")
    parser.add_argument("--context", type=int, default=1500)
    parser.add_argument("--caches", default="bf16,fp8", help=f"of {', '.join(CACHES)}")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--carveouts", default="", help="SMs cuBLAS leaves free, e.g. 16,32,48")
    args = parser.parse_args()
    commit = git_commit()
    for name in args.caches.split(","):
        for rows in map(int, args.rows.split(",")):
            layers = [Layer(rows, args.context, CACHES[name]) for _ in range(args.layers)]
            line = {"cache": name, "rows": rows, "context": args.context, "layers": args.layers}
            line |= summary(measure(layers, rows))
            carveouts = [int(x) for x in args.carveouts.split(",") if x]
            if carveouts and bench_attention.DEVICE.type == "cuda":
                line["overlap_us_by_carveout"] = carveout_us(layers, rows, carveouts)
            print(json.dumps({**line, "git_commit": commit}), flush=True)
            del layers
            if bench_attention.DEVICE.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
