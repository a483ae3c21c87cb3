"""Host time of the engine's step, without a device: schedule(), pack() and update() for decode
steps of N running requests of a given context (issue 10's target: <= 1.5 ms at 256 rows, 2K).

    python scripts/bench_host.py --rows 256 --context 2048 --steps 200
    python scripts/bench_host.py --mixed --rows 512 --max-batch-tokens 8192

--mixed times the steps with prefill instead: --rows prompts of 64-1,023 tokens (bulk's range,
seeded) prefilled in steps of --max-batch-tokens, every step from the first to the last prefill.

Prints one JSON line: milliseconds per step (median) for each phase. The device copy is left out
(CPU tensors are cloned instead); the GPU's launch calls come on top and are measured by the
engine's own host_ms_per_step in stats.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time

import torch

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.blocks import BlockManager
from bulkgen.engine.inputs import InputPacker
from bulkgen.engine.request import Request
from bulkgen.engine.scheduler import Scheduler
from bulkgen.engine.step import StepResult


def setup(
    lengths: list[int], params: SamplingParams, max_len: int, max_batch_tokens: int
) -> tuple[Scheduler, InputPacker]:
    """A scheduler holding one waiting request a prompt length (random ids, seeded) and a CPU
    packer for its steps, 16-token blocks, room for every request's max_len."""
    bs, rows = 16, len(lengths)
    cfg = EngineConfig(model="-", max_num_seqs=rows, max_batch_tokens=max_batch_tokens)
    blocks = BlockManager(rows * (max_len // bs + 2), bs, prefix_cache=True)
    sched = Scheduler(cfg, blocks, max_len, eos_ids=[0])
    gen = torch.Generator().manual_seed(0)
    for i, n in enumerate(lengths):
        prompt = torch.randint(1000, 100000, (n,), generator=gen).tolist()
        sched.add(Request(str(i), prompt, params, seed=i))
    packer = InputPacker(torch.device("cpu"), bs, max_batch_tokens, rows, max_len // bs + 1)
    return sched, packer


def prefilling(sched: Scheduler) -> bool:
    """A prompt is still waiting or not wholly prefilled."""
    return bool(sched.waiting) or any(r.num_computed < len(r.prompt_ids) for r in sched.running)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--sampling", default="greedy", choices=["greedy", "sample"])
    ap.add_argument("--profile", action="store_true", help="cProfile the timed steps")
    ap.add_argument("--mixed", action="store_true", help="time the steps with prefill")
    ap.add_argument("--max-batch-tokens", type=int, default=None, help="(--mixed) step budget")
    args = ap.parse_args()
    if args.mixed:
        return mixed(args)
    max_len = args.context + args.steps + 1024  # room for decodes during the prefills
    temperature = 0.0 if args.sampling == "greedy" else 0.8
    params = SamplingParams(
        max_tokens=max_len, ignore_eos=True, temperature=temperature, top_p=0.95
    )
    lengths = [args.context] * args.rows
    sched, packer = setup(lengths, params, max_len, max_batch_tokens=args.rows * 16)
    # Prefill until every request decodes (not timed).
    while prefilling(sched):
        plan = sched.schedule()
        packer.pack(plan, None)
        sched.update(plan, StepResult([7] * len(plan.sampled)))
    times: dict[str, list[float]] = {"schedule": [], "pack": [], "update": []}
    prev = None
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        plan = sched.schedule()
        t1 = time.perf_counter()
        packer.pack(plan, None)
        t2 = time.perf_counter()
        if prev is not None:
            sched.update(prev, StepResult([7] * len(prev.sampled)))
        t3 = time.perf_counter()
        prev = plan
        times["schedule"].append(t1 - t0)
        times["pack"].append(t2 - t1)
        times["update"].append(t3 - t2)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    line = {k: round(1e3 * statistics.median(v), 3) for k, v in times.items()}
    line["pack_min_ms"] = round(1e3 * min(times["pack"]), 3)
    line["total_ms"] = round(sum(line[k] for k in times), 3)
    line.update(rows=args.rows, context=args.context, sampling=args.sampling,
                seqs_per_step=len(prev.seqs))  # fmt: skip
    print(json.dumps(line))


def mixed(args) -> None:
    """Host time of the steps with prefill of a bulk-like batch (decoding rows beside chunks)."""
    tokens = args.max_batch_tokens or EngineConfig(model="-").max_batch_tokens
    params = SamplingParams(max_tokens=1024, ignore_eos=True, temperature=0.0)
    lengths = torch.randint(64, 1024, (args.rows,), generator=torch.Generator().manual_seed(0))
    sched, packer = setup(lengths.tolist(), params, 2200, max_batch_tokens=tokens)
    times: dict[str, list[float]] = {"schedule": [], "pack": [], "update": []}
    while prefilling(sched):
        t0 = time.perf_counter()
        plan = sched.schedule()
        t1 = time.perf_counter()
        packer.pack(plan, None)
        t2 = time.perf_counter()
        sched.update(plan, StepResult([7] * len(plan.sampled)))
        times["schedule"].append(t1 - t0)
        times["pack"].append(t2 - t1)
        times["update"].append(time.perf_counter() - t2)
    line = {k: round(1e3 * statistics.median(v), 3) for k, v in times.items()}
    line.update({f"{k}_max": round(1e3 * max(v), 3) for k, v in times.items()})
    line.update(rows=args.rows, max_batch_tokens=tokens, mixed_steps=len(times["pack"]))
    print(json.dumps(line))


if __name__ == "__main__":
    main()
