"""The scheduler's admission on synthetic workloads, without a model or a device.

Runs the real Scheduler (sampled ids chosen here: EOS where a request's drawn length ends) and
prices each step with a crude model of a Llama-3-8B step on an H200: the larger of the weights'
read time (16.06 GB at 4.3 TB/s) and the step's matmul time (2 x 8e9 FLOP per token at 600
TFLOP/s), plus the live KV read (131,072 bytes per token). A model, not a measurement: it tells
how many requests run at once and how much is recomputed; only scripts/bench.py on the GPU says
what is fast.

    python scripts/sim_admission.py --workload eos --requests 3000 --blocks 8000

Prints one JSON line per (max_num_seqs, output_reserve) setting.
"""

from __future__ import annotations

import argparse
import json
import random

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.blocks import BlockManager
from bulkgen.engine.request import Request
from bulkgen.engine.scheduler import Scheduler
from bulkgen.engine.step import StepResult
from bulkgen.model.attention.kv_layout import DEFAULT_BLOCK_SIZE

EOS = 2


def step_seconds(plan) -> float:
    context = sum(s.end for s in plan.seqs)
    return max(16.06e9 / 4.3e12, 2 * 8e9 * plan.num_tokens / 600e12) + context * 131072 / 4.3e12


def workload(name: str, n: int) -> list[tuple[int, int, int | None]]:
    """(prompt length, max_tokens, length at which EOS comes or None: EOS ignored)."""
    rng = random.Random(0)
    if name == "trt":
        return [(1000, 1000, None)] * n
    if name == "bulk":
        return [(rng.randint(64, 1024), rng.randint(64, 1024), None) for _ in range(n)]
    if name == "eos":  # a generous max_tokens; EOS after 50-600 tokens
        return [(rng.randint(64, 512), 2048, rng.randint(50, 600)) for _ in range(n)]
    if name == "bimodal":  # 85% short answers, 15% run to max_tokens (no EOS, not ignored)
        return [
            (rng.randint(64, 512), 1024, 1 << 30 if rng.random() < 0.15 else rng.randint(20, 200))
            for _ in range(n)
        ]
    raise ValueError(name)


def simulate(
    work, max_num_seqs, output_reserve, num_blocks: int, max_batch_tokens: int = 2048
) -> dict:
    cfg = EngineConfig(
        model="-",
        max_num_seqs=max_num_seqs,
        output_reserve=output_reserve,
        prefix_cache=False,
        max_batch_tokens=max_batch_tokens,
    )
    sched = Scheduler(cfg, BlockManager(num_blocks, DEFAULT_BLOCK_SIZE), 16384, eos_ids=[EOS])
    ends = {}
    for i, (prompt, max_tokens, eos_at) in enumerate(work):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=eos_at is None)
        sched.add(Request(str(i), [5] * prompt, params, seed=0))
        ends[str(i)] = eos_at or 1 << 30  # None: ignore_eos, runs to max_tokens
    seconds = steps = rows = mixed = mixed_rows = decode_rows = 0
    while sched.num_unfinished:
        plan = sched.schedule()
        decoding = sum(s.num_tokens == 1 for s in plan.seqs)
        decode_rows += decoding
        if decoding < len(plan.seqs):  # a step with prefill: run eagerly
            mixed, mixed_rows = mixed + 1, mixed_rows + decoding
        ids = [
            EOS if len(s.request.output_ids) + 1 >= ends[s.request.request_id] else 7
            for s in plan.sampled
        ]
        sched.update(plan, StepResult(ids))
        sched.take_finished()
        seconds += step_seconds(plan)
        steps, rows = steps + 1, rows + len(plan.seqs)
    return {
        "max_num_seqs": max_num_seqs,
        "output_reserve": output_reserve,
        "max_batch_tokens": max_batch_tokens,
        # Steps with prefill (eager: their launches cost the host 23-38 ms at 0cbf7c0) and the
        # share of decoding rows computed in them.
        "mixed_steps": mixed,
        "decode_rows_in_mixed": round(mixed_rows / max(1, decode_rows), 3),
        "model_tok_per_s": round(sched.num_generated / seconds),
        "steps": steps,
        "mean_rows": round(rows / steps),
        "max_running_seqs": sched.max_running,
        "max_num_seqs_chosen_max": sched.admission.cap_max,
        "preemptions": sched.num_preemptions,
        "recomputed_tokens": sched.num_recomputed,
        "generated_tokens": sched.num_generated,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="eos", choices=["trt", "bulk", "eos", "bimodal"])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--blocks", type=int, default=8000, help="16-token KV blocks")
    ap.add_argument(
        "--max-batch-tokens", default="2048", help="tokens a step, or a comma list of them"
    )
    args = ap.parse_args()
    work = workload(args.workload, args.requests)
    settings = [(256, 0.0), (512, 0.0), (1024, 0.0), (256, None), (512, None), ("auto", None)]
    for tokens in (int(t) for t in args.max_batch_tokens.split(",")):
        for max_num_seqs, reserve in settings:
            line = simulate(work, max_num_seqs, reserve, args.blocks, tokens)
            print(
                json.dumps({"workload": args.workload, "blocks": args.blocks, **line}), flush=True
            )


if __name__ == "__main__":
    main()
