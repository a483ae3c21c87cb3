"""Does a GEMM's first launch at a new row count wait for the GPU?

In bulk FP8 runs at 8,192-token steps the engine thread spent each step with prefill's launch
(about 125 ms, the step's GPU time) inside the logits' F.linear (py-spy, 6736282), where the same
launch alone, repeated at one shape, took 12 ms (bench_eager_host.py --api). The logits' rows
change from step to step. This holds the GPU 200 ms behind (a sleep kernel), then times the host
side of one [M, 4096] x [4096, 128256] bf16 GEMM for row counts M never used before and again for
the same M: a first use that waits shows about 200 ms. Run under CUDA_MODULE_LOADING=EAGER too
(every kernel loaded at start): if the wait is the lazy loading of cuBLAS's kernel, it goes. A
new thread then repeats each M: whether a first use in one thread spares another.

--shapes takes other weights (out:in features), e.g. the 8B's projections (qkv, o, gate_up,
down) "6144:4096,4096:4096,28672:4096,4096:14336" and their halves under --tp 2; --rows then the
token counts of eager steps with prefill (under tensor parallelism the pieces are off: every GEMM
runs at the step's own count). --fp8 runs torch._scaled_mm on e4m3 operands instead.

    python scripts/bench_gemm_first_use.py [--rows 1,7,33,100,257,333,480,511]
    python scripts/bench_gemm_first_use.py --shapes 6144:4096,4096:14336 --rows 300,1111,4567
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import torch
import torch.nn.functional as F


def host_ms(gemm, hidden: torch.Tensor) -> float:
    torch.cuda._sleep(400_000_000)  # about 200 ms of GPU time ahead of the GEMM
    t0 = time.perf_counter()
    gemm(hidden)
    ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return round(ms, 3)


def make_gemm(out_features: int, in_features: int, fp8: bool):
    """hidden [M, in] -> [M, out] through F.linear in bf16, or torch._scaled_mm on e4m3."""
    weight = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16)
    if not fp8:
        return lambda hidden: F.linear(hidden, weight)
    w8 = weight.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return lambda hidden: torch._scaled_mm(
        hidden.to(torch.float8_e4m3fn), w8.t(), one, one, out_dtype=torch.bfloat16
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,7,33,100,257,333,480,511")
    ap.add_argument("--shapes", default="128256:4096", help="out:in features, comma-separated")
    ap.add_argument("--fp8", action="store_true", help="torch._scaled_mm on e4m3 operands")
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        out_features, in_features = (int(n) for n in shape.split(":"))
        gemm = make_gemm(out_features, in_features, args.fp8)
        gemm(torch.randn(64, in_features, device="cuda", dtype=torch.bfloat16))
        torch.cuda.synchronize()
        for m in (int(r) for r in args.rows.split(",")):
            hidden = torch.randn(m, in_features, device="cuda", dtype=torch.bfloat16)
            line = {"shape": shape, "fp8": args.fp8, "rows": m}
            line.update(first_ms=host_ms(gemm, hidden), again_ms=host_ms(gemm, hidden))
            # The engine warms in the thread that builds it and steps in its own: does a first
            # use carry over?
            other: list[float] = []
            run = lambda o=other, g=gemm, h=hidden: o.append(host_ms(g, h))  # noqa: E731
            thread = threading.Thread(target=run)
            thread.start()
            thread.join()
            line["other_thread_ms"] = other[0]
            line["module_loading"] = os.environ.get("CUDA_MODULE_LOADING", "default")
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
