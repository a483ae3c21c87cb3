"""What a step with prefill costs the host: the eager forward's launches, against a graph replay.

At 0cbf7c0 the H200 runs' mixed steps (decoding rows beside a prefill chunk: no CUDA graph) took
the engine thread 23 ms (bf16) to 38 ms (FP8) each, against 3-4 ms for a decode step: more than
an FP8 mixed step's GPU time, so FP8 runs idled. This times ModelRunner.launch of one mixed step
(ROWS decoding rows of CONTEXT tokens and one CHUNK-token prefill) and of one decode step of the
same rows, on an engine of the 8B shape with dummy weights. The GPU is first given 200 ms of sleep
on the compute stream, so the launches never wait for it: host ms is the launch calls alone, GPU
ms the step's kernels (CUDA events). --profile adds the launch's Python functions by own time;
--kernels the step's GPU kernels by total time (one more step under torch.profiler: where does a
bulk FP8 mixed step's 37 ms go, against about 27 ms for its GEMMs and KV reads by the roofline?).
--api the launch's CUDA driver and runtime calls by host time, the GPU held 200 ms behind: a call
that waits for the GPU shows about 200 ms (at 8,192-token steps the engine thread's launch of a
mixed step took as long as the step ran on the GPU, in the logits' F.linear by py-spy, 6736282).

`host_ms_first_two` are the two untimed launches before them: with --mixed-graphs the first is
the first launch of its bucket's pieces since their capture (does it wait for the GPU, as every
run's first step with prefill does? README, the first step's launch wait).

    python scripts/bench_eager_host.py --rows 441 --chunk 1607 [--fp8] [--mixed-graphs] [--kernels]

Prints one JSON line per step kind. On the CPU (--device cpu --model DIR) it runs for a smoke
test only: there the kernels run inside the launch.
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
from bulkgen.engine.engine import Engine
from bulkgen.engine.plan import Plan, ScheduledSeq
from bulkgen.engine.request import Request
from bulkgen.model.shapes import LLAMA3_8B

GREEDY = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)


def step_plan(
    rows: int,
    context: int,
    chunk: int,
    block_size: int,
    num_blocks: int,
    shuffled: bool = False,
    prompts: int = 1,
) -> Plan:
    """rows decoding sequences of `context` tokens, then (chunk > 0) `chunk` prompt tokens: one
    new prompt's, or `prompts` new prompts' of chunk // prompts each (the first takes the rest;
    a `trt` step with prefill holds about seven 1,000-token prompts). The blocks wrap around the
    cache: what attention reads is garbage, its cost is not. Each sequence's blocks are
    consecutive, or (shuffled) drawn at random from the whole cache, as a long run's churn leaves
    them (a seeded permutation: the same blocks every call)."""
    plan, next_block = Plan(), 0
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    shapes = [(context, context - 1, 1)] * rows
    if chunk:
        sizes = [chunk // prompts] * prompts
        sizes[0] += chunk - sum(sizes)
        shapes += [(size, 0, size) for size in sizes]
    for i, (length, start, tokens) in enumerate(shapes):
        req = Request(f"bench-{i}", [1] * length, GREEDY, seed=i, table_row=i)
        count = -(-length // block_size)
        req.block_ids = [(next_block + j) % num_blocks for j in range(count)]
        if shuffled:
            req.block_ids = [order[i] for i in req.block_ids]
        next_block += count
        plan.seqs.append(ScheduledSeq(req, start, tokens, sample=True, from_prev=False))
    return plan


def time_launches(engine: Engine, plan: Plan, reps: int, profile: bool) -> dict:
    runner, cuda = engine.runner, engine.device.type == "cuda"
    host, gpu, stats, untimed = [], [], None, []
    for i in range(reps + 2):  # two untimed: first-use work (allocations, algorithm choice)
        start = end = None
        if cuda:
            with torch.cuda.stream(runner.compute_stream):
                torch.cuda._sleep(400_000_000)  # about 200 ms at H200 clocks
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
        prof = cProfile.Profile() if profile and i == reps + 1 else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        step = runner.launch(plan)
        if prof:
            prof.disable()
            stats = pstats.Stats(prof)
        t1 = time.perf_counter()
        if cuda:
            with torch.cuda.stream(runner.compute_stream):
                end.record()
        step.wait()
        if i >= 2:
            host.append((t1 - t0) * 1e3)
            gpu.append(start.elapsed_time(end) if cuda else None)
        else:
            untimed.append(round((t1 - t0) * 1e3, 3))
    line = {
        # The two untimed launches' host ms: the first launch of this step's graphs and kernels
        # (a launch that waits for the GPU shows the 200 ms sleep ahead of it).
        "host_ms_first_two": untimed,
        "host_ms_median": round(statistics.median(host), 3),
        "host_ms_min": round(min(host), 3),
        "gpu_ms_median": round(statistics.median(gpu), 3) if cuda else None,
    }
    if stats is not None:
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:15]
        line["profile_own_ms"] = [
            [f"{fn[0].rsplit('/', 1)[-1]}:{fn[1]}({fn[2]})", calls, round(own * 1e3, 3)]
            for fn, (_, calls, own, _, _) in rows
        ]
    return line


def summed(events, keep) -> list[tuple[str, int, float]]:
    """torch.profiler events for which keep(event) holds, summed by name: (name, count, ms),
    largest total first."""
    totals: dict[str, list] = {}
    for e in events:
        if keep(e):
            entry = totals.setdefault(e.name[:90], [0, 0.0])
            entry[0] += 1
            entry[1] += e.time_range.elapsed_us() / 1e3
    return sorted(((name, n, ms) for name, (n, ms) in totals.items()), key=lambda t: -t[2])


def kernel_totals(engine: Engine, plan: Plan, top: int = 18) -> dict:
    """One step's GPU kernels under torch.profiler, summed by name: [name, launches, total ms]
    for the `top` largest, and the sum over all of them (kernels in graph replays included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.runner.launch(plan).wait()
        torch.cuda.synchronize()
    ranked = summed(prof.events(), lambda e: e.device_type == torch.autograd.DeviceType.CUDA)
    return {
        "kernels_ms_total": round(sum(ms for _, _, ms in ranked), 3),
        "kernels_top": [[name, n, round(ms, 3)] for name, n, ms in ranked[:top]],
    }


def api_totals(engine: Engine, plan: Plan, top: int = 10) -> dict:
    """One launch, 200 ms behind the GPU, under torch.profiler: its CUDA API calls by host time,
    [name, calls, total ms] for the `top` largest (the profiler's own synchronize at its exit
    among them)."""
    from torch.profiler import ProfilerActivity, profile

    runner = engine.runner
    with torch.cuda.stream(runner.compute_stream):
        torch.cuda._sleep(400_000_000)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step = runner.launch(plan)
    step.wait()
    cpu = torch.autograd.DeviceType.CPU
    ranked = summed(prof.events(), lambda e: e.device_type == cpu and e.name.startswith("cu"))
    return {"api_top": [[name, n, round(ms, 3)] for name, n, ms in ranked[:top]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=441)
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--chunk", type=int, default=1607)
    ap.add_argument("--fp8", action="store_true", help="FP8 weights and KV cache")
    ap.add_argument(
        "--mixed-graphs",
        action="store_true",
        help="the mixed step through mixed_graphs.py's pieces",
    )
    ap.add_argument(
        "--shuffled-blocks",
        action="store_true",
        help="each sequence's blocks at random over the cache (default: consecutive)",
    )
    ap.add_argument(
        "--chunk-prompts", type=int, default=1, help="new prompts sharing the chunk's tokens"
    )
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="the step's GPU kernels by total time")
    ap.add_argument("--api", action="store_true", help="the launch's CUDA API calls by host time")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None, help="a model folder (default: 8B dummy)")
    args = ap.parse_args()
    options = {"quantization": "fp8", "kv_cache_dtype": "fp8"} if args.fp8 else {}
    cfg = EngineConfig(
        model=args.model or "llama3-8b-dummy",
        load_format="auto" if args.model else "dummy",
        device=args.device,
        max_model_len=args.context + args.chunk + 16,
        max_batch_tokens=max(2048, args.rows + args.chunk),
        prefix_cache=False,
        mixed_graphs=args.mixed_graphs,
        **({"dtype": "float32"} if args.device == "cpu" else {}),
        **options,
    )
    engine = Engine(cfg, model_config=None if args.model else dict(LLAMA3_8B))
    num_blocks = engine.scheduler.blocks.num_blocks
    for kind, chunk in (("mixed", args.chunk), ("decode", 0)):
        plan = step_plan(
            args.rows,
            args.context,
            chunk,
            engine.cfg.block_size,
            num_blocks,
            args.shuffled_blocks,
            args.chunk_prompts,
        )
        line = {"step": kind, "rows": args.rows, "context": args.context, "chunk": chunk}
        line["chunk_prompts"] = args.chunk_prompts if chunk else 0
        line.update(shuffled_blocks=args.shuffled_blocks, num_blocks=num_blocks)
        line.update(fp8=args.fp8, mixed_graphs=args.mixed_graphs)
        line.update(time_launches(engine, plan, args.reps, args.profile))
        if args.kernels and engine.device.type == "cuda":
            line.update(kernel_totals(engine, plan))
        if args.api and engine.device.type == "cuda":
            line.update(api_totals(engine, plan))
        print(json.dumps(line), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
