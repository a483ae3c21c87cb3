"""Does a GEMM's first launch at a new row count wait for the GPU?

In bulk FP8 runs at 8,192-token steps the engine thread spent each step with prefill's launch
(about 125 ms, the step's GPU time) inside the logits' F.linear (py-spy, 6736282), where the same
launch alone, repeated at one shape, took 12 ms (bench_eager_host.py --api). The logits' rows
change from step to step. This holds the GPU 200 ms behind (a sleep kernel), then times the host
side of one [M, 4096] x [4096, 128256] bf16 GEMM for row counts M never used before and again for
the same M: a first use that waits shows about 200 ms. Run under CUDA_MODULE_LOADING=EAGER too
(every kernel loaded at start): if the wait is the lazy loading of cuBLAS's kernel, it goes. A
new thread then repeats each M: whether a first use in one thread spares another.

    python scripts/bench_gemm_first_use.py [--rows 1,7,33,100,257,333,480,511]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import torch
import torch.nn.functional as F


def host_ms(hidden: torch.Tensor, weight: torch.Tensor) -> float:
    torch.cuda._sleep(400_000_000)  # about 200 ms of GPU time ahead of the GEMM
    t0 = time.perf_counter()
    F.linear(hidden, weight)
    ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return round(ms, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,7,33,100,257,333,480,511")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--hidden", type=int, default=4096)
    args = ap.parse_args()
    weight = torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16)
    F.linear(torch.randn(64, args.hidden, device="cuda", dtype=weight.dtype), weight)
    torch.cuda.synchronize()
    for m in (int(r) for r in args.rows.split(",")):
        hidden = torch.randn(m, args.hidden, device="cuda", dtype=weight.dtype)
        line = {"rows": m, "first_ms": host_ms(hidden, weight), "again_ms": host_ms(hidden, weight)}
        # The engine warms in the thread that builds it and steps in its own: does it carry over?
        other: list[float] = []
        thread = threading.Thread(target=lambda o=other, h=hidden: o.append(host_ms(h, weight)))
        thread.start()
        thread.join()
        line["other_thread_ms"] = other[0]
        line["module_loading"] = os.environ.get("CUDA_MODULE_LOADING", "default")
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
