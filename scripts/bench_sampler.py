"""Benchmark the fused Triton sampler against the torch sampler; one JSON line per configuration.

    PYTHONPATH=. python scripts/bench_sampler.py [--flat] [--vocab 128256] [--npiv 4 ...]

For batch 32 and 256 and each sampling setting (greedy; temperature 0.8 alone, with top-p 0.95,
with top-k 50, with min-p 0.05; top-p 0.95 under a bitmask allowing half the vocabulary), reports
the median milliseconds per call of `sampler.sample`, of `fused_sample` launched eagerly and of
`fused_sample` replayed from a CUDA graph (which also shows it is graph-safe), and the fraction of
rows where both samplers chose the same token (1.0 but for near-ties of race values in float32).

Logits are model-like by default: a Zipf law with exponent 1.5 over a random order of the
vocabulary (the top token holds ~38% of the mass, the top-p 0.95 set a few hundred tokens).
--flat draws N(0, 4) logits instead, where every filter has to search for its threshold: the slow
case of the fused sampler. --npiv, --block, --pivot-block and --num-warps override the kernel's
tuning constants in `triton_sampler` for this run (each line reports the values used).
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from bulkgen.engine import triton_sampler
from bulkgen.engine.sampler import SamplingTensors, sample, unpack_bitmask
from bulkgen.engine.triton_sampler import fused_sample

DEVICE = torch.device("cuda")
TUNING = ("NPIV", "BLOCK", "PIVOT_BLOCK", "NUM_WARPS")
SETTINGS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_p": dict(temperature=0.8, top_p=0.95),
    "top_k": dict(temperature=0.8, top_k=50),
    "min_p": dict(temperature=0.8, min_p=0.05),
    "mask": dict(temperature=0.8, top_p=0.95, mask=True),
}


def make_logits(b: int, v: int, flat: bool) -> torch.Tensor:
    if flat:
        return torch.randn(b, v, device=DEVICE) * 2
    ranks = torch.rand(b, v, device=DEVICE).argsort(dim=-1).float() + 1
    return -1.5 * ranks.log() + 0.05 * torch.randn(b, v, device=DEVICE)


def make_params(b: int, temperature=0.8, top_k=0, top_p=1.0, min_p=0.0) -> dict:
    def full(x, dtype):
        return torch.full((b,), x, dtype=dtype, device=DEVICE)

    return dict(
        temperature=full(temperature, torch.float32),
        top_k=full(top_k, torch.int64),
        top_p=full(top_p, torch.float32),
        min_p=full(min_p, torch.float32),
        seed=torch.arange(b, device=DEVICE) + (1 << 33),
        position=torch.full((b,), 1000, device=DEVICE),
    )


def half_mask(b: int, v: int) -> torch.Tensor:
    words = torch.randint(-(2**31), 2**31 - 1, (b, -(-v // 32)), device=DEVICE, dtype=torch.int64)
    return words.int()


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up that compiles the kernel); returns replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def bench_one(name: str, b: int, v: int, flat: bool) -> dict:
    setting = dict(SETTINGS[name])
    masked = setting.pop("mask", False)
    logits = make_logits(b, v, flat)
    p = make_params(b, **setting)
    words = half_mask(b, v) if masked else None
    allowed = unpack_bitmask(words, v) if masked else None
    st = SamplingTensors(
        **p,
        all_greedy=setting["temperature"] == 0.0,
        any_filter=any(k in setting for k in ("top_k", "top_p", "min_p")),
    )
    ref = sample(logits, st, allowed)
    ids = fused_sample(logits, **p, allowed=words)
    replay, graph_ids = graph_of(lambda: fused_sample(logits, **p, allowed=words))
    replay()
    torch.cuda.synchronize()
    return {
        "setting": name,
        "batch": b,
        "vocab": v,
        "logits": "flat" if flat else "zipf",
        "torch_ms": round(do_bench(lambda: sample(logits, st, allowed)), 4),
        "fused_ms": round(do_bench(lambda: fused_sample(logits, **p, allowed=words)), 4),
        "fused_graph_ms": round(do_bench(replay), 4),
        "agree": (ref == ids).float().mean().item(),
        "graph_agrees": bool(torch.equal(graph_ids, ids)),
        **{name.lower(): getattr(triton_sampler, name) for name in TUNING},
    }


def bench_fused_sample(vocab: int = 128256, flat: bool = False) -> None:
    """Print one JSON line per (setting, batch)."""
    torch.manual_seed(0)
    for b in (32, 256):
        for name in SETTINGS:
            print(json.dumps(bench_one(name, b, vocab, flat)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--flat", action="store_true", help="N(0, 4) logits: the slow case")
    for name in TUNING:
        parser.add_argument("--" + name.lower().replace("_", "-"), type=int)
    args = parser.parse_args()
    for name in TUNING:  # a benchmark run's own settings, not a library default
        if getattr(args, name.lower()) is not None:
            setattr(triton_sampler, name, getattr(args, name.lower()))
    bench_fused_sample(args.vocab, args.flat)
