"""Benchmark the batch-invariant matmul's candidate tilings against cuBLAS on Llama-3-8B's GEMMs
(GPU only); one JSON line per (shape, M, config), then a summary.

    PYTHONPATH=. python scripts/bench_invariant_mm.py [--configs m64n64k128,...] [--ms 1,64]
        [--default library | NAME | qkv=NAME,down=NAME,...]      (or INVMM_DEFAULT=...)

Each GEMM runs as the engine runs a decode step: replayed from a CUDA graph (no launch gaps),
cycling over enough copies of the weight that it is read from HBM, not from the 50 MB L2. Times
are the median over --iters replays measured with CUDA events, per call. Every line has TFLOP/s,
the weight+activation bandwidth, cuBLAS's time (torch.nn.functional.linear, the same graph
treatment) and speed_vs_cublas = cublas_ms / ms; and the checks, made once per (shape, config):
invariant (rows of M=300 equal bit for bit those of M=37 and 64, of single rows at several tile
positions and of a permutation), rel_err against float32 beside cuBLAS's, and bits_equal_default
(the same bits as the "default" config: whether tilings differ in arithmetic at all).

"default" is the library's rule (invariant_matmul.default_config) unless --default names a
candidate for every shape or per shape. The summary names, per shape, the one candidate with
the best geometric-mean speed over all M (one tiling per shape, as the library must use; its
--default spec is printed), and per M the step's GEMM time (32 layers of qkv, o, gate_up and
down plus lm_head) with the default, with those candidates and with cuBLAS, so that a new rule
for default_config can be read off the output. Only this script takes that choice; the
library's tiling stays a constant rule on (N, K, dtype).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F
import triton

from bulkgen.model.invariant_matmul import (
    CANDIDATES,
    TILINGS_FILE,
    MatmulConfig,
    default_config,
)
from bulkgen.model.invariant_matmul import invariant_matmul as triton_mm

SHAPES = {  # Llama-3-8B, (N, K)
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}
LAYERS = 32
L2_BYTES = 256 << 20  # cycle weight copies totalling at least this (H200 L2: 50 MB)
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")


def parse_default(spec: str) -> dict[str, MatmulConfig]:
    """'library', a candidate name, or 'shape=name,...' (other shapes: the library's rule)."""
    chosen = {s: default_config(n, k, DTYPE) for s, (n, k) in SHAPES.items()}
    if spec in ("", "library"):
        return chosen
    if "=" not in spec:
        return {s: CANDIDATES[spec] for s in SHAPES}
    for part in spec.split(","):
        shape, name = part.split("=")
        chosen[shape] = CANDIDATES[name]
    return chosen


def graph_ms(fn, xs: torch.Tensor, weights: list[torch.Tensor], iters: int, est_ms: float):
    """Median ms per call of fn(x, w) over weights in turn, replayed from one CUDA graph."""
    reps = len(weights) * max(1, math.ceil(2.0 / max(est_ms, 1e-3) / len(weights)))
    reps = min(reps, max(len(weights), 64))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(xs, weights[0])  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(xs, weights[i % len(weights)])
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    del graph
    return statistics.median(times)


def checks(w: torch.Tensor, cfg: MatmulConfig, reference_bits: torch.Tensor | None, x300):
    """(invariant, rel_err, bits_equal_default, y300) of this config on this weight."""
    y300 = triton_mm(x300, w, None, cfg)
    same = all(torch.equal(triton_mm(x300[:m], w, None, cfg), y300[:m]) for m in (37, 64))
    for r in (0, 5, 36, 63, 64, 129, 299):  # alone, at tile position 0, vs its place in y300
        same &= torch.equal(triton_mm(x300[r : r + 1].clone(), w, None, cfg)[0], y300[r])
    perm = torch.randperm(300, device=DEVICE)
    same &= torch.equal(triton_mm(x300[perm], w, None, cfg), y300[perm])
    ref = F.linear(x300.float(), w.float())
    rel_err = ((y300.float() - ref).norm() / ref.norm()).item()
    equal_default = None if reference_bits is None else torch.equal(y300, reference_bits)
    return same, rel_err, equal_default, y300


def bench_shape(shape: str, configs: dict[str, MatmulConfig], ms: list[int], iters: int):
    n, k = SHAPES[shape]
    w0 = torch.randn(n, k, device=DEVICE, dtype=DTYPE) / k**0.5
    copies = max(1, math.ceil(L2_BYTES / w0.nbytes))
    weights = [w0] + [w0.clone() for _ in range(copies - 1)]
    x300 = torch.randn(300, k, device=DEVICE, dtype=DTYPE)
    ref = F.linear(x300.float(), w0.float())
    cublas_err = ((F.linear(x300, w0).float() - ref).norm() / ref.norm()).item()
    default_bits = triton_mm(x300, w0, None, configs["default"])
    checked = {}
    for name, cfg in configs.items():
        try:
            checked[name] = checks(w0, cfg, default_bits, x300)[:3]
        except Exception as e:  # a tiling that does not compile or fit: report, go on
            print(json.dumps({"shape": shape, "config": name, "error": str(e)[:300]}), flush=True)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
        flops = 2.0 * m * n * k
        bytes_moved = (n * k + m * k + m * n) * 2
        est_ms = max(flops / 600e12, bytes_moved / 3.5e12) * 1e3
        cublas_ms = graph_ms(F.linear, x, weights, iters, est_ms)
        for name, (invariant, rel_err, equal_default) in checked.items():
            cfg = configs[name]
            try:
                t = graph_ms(
                    lambda a, b, cfg=cfg: triton_mm(a, b, None, cfg), x, weights, iters, est_ms
                )
            except Exception as e:  # e.g. a graph capture this Triton refuses: report, go on
                error = {"shape": shape, "M": m, "config": name, "error": str(e)[:300]}
                print(json.dumps(error), flush=True)
                continue
            row = {
                "shape": shape,
                "N": n,
                "K": k,
                "M": m,
                "config": name,
                "tiling": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages],
                "tma": cfg.tma,
                "ms": round(t, 5),
                "tflops": round(flops / t / 1e9, 1),
                "gbps": round(bytes_moved / t / 1e6, 1),
                "cublas_ms": round(cublas_ms, 5),
                "cublas_tflops": round(flops / cublas_ms / 1e9, 1),
                "speed_vs_cublas": round(cublas_ms / t, 3),
                "invariant": invariant,
                "rel_err": round(rel_err, 6),
                "cublas_rel_err": round(cublas_err, 6),
                "bits_equal_default": equal_default,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def summarize(rows: list[dict], ms: list[int]) -> dict[str, str]:
    """The tiling of each shape with the best geometric-mean speed over all M (one per shape, as
    the library must use), then per M the step's GEMM time (32 layers + lm_head) with the
    default, with those tilings, and with cuBLAS."""
    weight = {s: (1 if s == "lm_head" else LAYERS) for s in SHAPES}
    best = {}
    for s in [s for s in SHAPES if any(r["shape"] == s for r in rows)]:
        # Only tilings that passed the invariance check may be the best.
        mine = [r for r in rows if r["shape"] == s and r["config"] != "default" and r["invariant"]]
        score = {}
        for c in sorted({r["config"] for r in mine}):
            speeds = [math.log(r["speed_vs_cublas"]) for r in mine if r["config"] == c]
            score[c] = round(math.exp(statistics.mean(speeds)), 3)
        best[s] = max(score, key=score.get)
        ranked = dict(sorted(score.items(), key=lambda kv: -kv[1]))
        line = {"summary": "shape", "shape": s, "geomean_speed_vs_cublas": ranked}
        print(json.dumps(line), flush=True)
    spec = ",".join(f"{s}={c}" for s, c in best.items())
    print(json.dumps({"summary": "best_tilings", "default_spec": spec}), flush=True)
    if set(best) != set(SHAPES):
        return best
    for m in ms:
        total = {"default": 0.0, "best": 0.0, "cublas": 0.0}
        for s in SHAPES:
            mine = {r["config"]: r for r in rows if r["shape"] == s and r["M"] == m}
            if "default" not in mine or best[s] not in mine:  # one failed: no total
                total = {}
                break
            total["default"] += weight[s] * mine["default"]["ms"]
            total["best"] += weight[s] * mine[best[s]]["ms"]
            total["cublas"] += weight[s] * mine["default"]["cublas_ms"]
        if not total:
            continue
        line = {"summary": "step_gemms", "M": m} | {
            f"{k}_ms": round(v, 4) for k, v in total.items()
        }
        line["default_vs_cublas"] = round(total["cublas"] / total["default"], 3)
        line["best_vs_cublas"] = round(total["cublas"] / total["best"], 3)
        print(json.dumps(line), flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--ms", default="1,64,256,512,1024,4096")
    parser.add_argument("--configs", default=",".join(CANDIDATES))
    parser.add_argument("--default", default=os.environ.get("INVMM_DEFAULT", "library"))
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument(
        "--write-table",
        action="store_true",
        help="record each shape's best tiling in bulkgen/model/invariant_tilings.json, which "
        "default_config reads (the library's tiling then is the measured one)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    ms = [int(m) for m in args.ms.split(",")]
    chosen = parse_default(args.default)
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "default": {
                    s: [c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages]
                    for s, c in chosen.items()
                },
            }
        ),
        flush=True,
    )
    rows = []
    for shape in args.shapes.split(","):
        configs = {"default": chosen[shape]} | {n: CANDIDATES[n] for n in args.configs.split(",")}
        rows += bench_shape(shape, configs, ms, args.iters)
    best = summarize(rows, ms)
    if args.write_table:
        write_table(best, ms)


def write_table(best: dict[str, str], ms: list[int]) -> None:
    """Merge the shapes' best tilings into TILINGS_FILE, keyed by dtype and "NxK"."""
    table = json.loads(TILINGS_FILE.read_text()) if TILINGS_FILE.exists() else {}
    shapes = table.setdefault(str(DTYPE).removeprefix("torch."), {})
    shapes.update({f"{SHAPES[s][0]}x{SHAPES[s][1]}": name for s, name in best.items()})
    table["measured"] = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{triton.__version__}: best geometric-mean speed at M = {ms}"
    )
    TILINGS_FILE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(json.dumps({"summary": "table_written", "file": str(TILINGS_FILE), **table}), flush=True)


if __name__ == "__main__":
    main()
