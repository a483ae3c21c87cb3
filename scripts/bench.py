"""Benchmark bulkgen against the HBM roofline and transformers' continuous batching (GPU).

Llama-3-8B shape with dummy bf16 weights and the real Llama-3.1 tokenizer (carried to the device,
never committed). Each (workload, engine) runs in its own process and prints one JSON line;
startup (load, cache, graph capture) is reported apart from wall_s. A PNG shows tokens/s and GPU
busy over time, async against sync. --shape 70b runs the Llama-3.1-70B shape instead; engine
bulkgen-tp2 splits it over two GPUs (--tensor-parallel 2), bulkgen-dp2 runs two workers.

    python scripts/bench.py --tokenizer .carry --workloads blog,bulk --out results/bench
    python scripts/bench.py --shape 70b --workloads bulk --engines bulkgen,bulkgen-tp2
    python scripts/bench.py --workloads trt --engines bulkgen --max-num-seqs 128,256,512,1024,auto

A comma list of --max-num-seqs values is a sweep: each bulkgen run prints its own line with the
setting, the size auto chose, preemptions and recomputed tokens. So is a comma list of
--max-batch-tokens values (tokens a step, prefill chunks included): fewer, larger mixed steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench_bulkgen import (
    STATS_KEYS,
    data_parallel,
    distinct_settings,
    engine_options,
    run_bulkgen,
    run_list,
    seq_setting,
    tensor_parallel,
)
from bench_commit import git_commit
from bench_measure import env_fields, measure_ceilings, save_series
from bench_transformers import run_transformers
from bench_workloads import make_workload, model_folder, roofline_compute_s, split_roofline_s

from bulkgen.model.shapes import SHAPES

# ---- measurement helpers ---------------------------------------------------------------------


# ---- engines (each in its own process) -------------------------------------------------------


def token_work(work, model_dir: Path):
    """Text prompts as the ids bulkgen generates from (chat template, tokenizer): the roofline
    counts tokens."""
    if not work or not isinstance(work[0][0], str):
        return work
    from bulkgen.text.encoder import PromptEncoder
    from bulkgen.text.template import ChatTemplate
    from bulkgen.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    encoder = PromptEncoder(tokenizer, ChatTemplate(tokenizer))
    ids = encoder.encode([p for p, _ in work])
    return [(i, o) for i, (_, o) in zip(ids, work, strict=True)]


def child(args) -> None:
    work = make_workload(args.workload, args.out_len, args.num_prompts)
    if args.engine.startswith("transformers"):
        work = work[: args.hf_sample] if args.hf_sample else work
        result = run_transformers(args, work, use_async=args.engine.endswith("async"))
    else:
        result = run_bulkgen(
            args,
            work,
            sync=args.engine == "bulkgen-sync",
            prefix_cache=args.engine != "bulkgen-noprefix",
            workers=data_parallel(args.engine),
            tp=tensor_parallel(args.engine),
            options=engine_options(args.engine),
        )
    result["num_prompts"] = len(work)
    work = token_work(work, Path(args.model_dir))
    result["prompt_tokens"] = sum(len(p) for p, _ in work)
    tp, shape = tensor_parallel(args.engine), dict(SHAPES[args.shape])
    # The roofline at the batch size the run could use: auto's largest choice.
    seqs = seq_setting(args.max_num_seqs)
    seqs = (result.get("max_num_seqs_chosen_max") or 1024) if seqs == "auto" else seqs
    options = engine_options(args.engine)
    fp8 = {
        "fp8_weights": options.get("quantization") == "fp8",
        # One byte a KV element (int8's scales, 4 / head_dim more, are left out).
        "kv_fp8": options.get("kv_cache_dtype") in ("fp8", "int8"),
    }
    workers = data_parallel(args.engine)
    run = work, workers, args, seqs, tp, shape
    result["roofline_s"] = split_roofline_s(*run, **fp8)
    result["roofline_compute_s"] = split_roofline_s(*run, roofline=roofline_compute_s, **fp8)
    Path(args.result).write_text(json.dumps(result))


# ---- parent ----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workloads", default="blog,bulk")
    ap.add_argument("--engines", default="bulkgen,bulkgen-sync,transformers")
    ap.add_argument(
        "--sampling",
        default="greedy",
        help="comma-separated bulkgen sampling settings: greedy; sample (temperature 0.8, top-p "
        "0.95, seeded); logprobs (greedy with the top 5 logprobs); json (greedy under one 8-field "
        "JSON schema; needs xgrammar on the GPU machine: see gpu_check.sh)",
    )
    ap.add_argument("--out-len", type=int, default=2048)
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument(
        "--max-num-seqs",
        default="auto",
        help="a number, auto, or a comma list of them: a sweep (bulkgen engines only)",
    )
    ap.add_argument(
        "--max-batch-tokens", default="", help="tokens a step, or a comma list: a sweep (bulkgen)"
    )
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--hf-sample", type=int, default=128, help="requests given to transformers")
    ap.add_argument("--hf-out-len", type=int, default=512, help="blog out_len for transformers")
    ap.add_argument("--tokenizer", default=".carry", help="folder with the Llama-3.1 tokenizer")
    ap.add_argument(
        "--shape", choices=sorted(SHAPES), default="8b", help="model shape (dummy weights)"
    )
    ap.add_argument("--out", default="bench-results")
    # child-process arguments
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("workload", "engine", "result", "model-dir"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    ap.add_argument(
        "--profile-at",
        type=float,
        default=None,
        help="profile 0.4 s of kernels this many seconds in (diagnostic: starting the profiler "
        "stalls the run for seconds, so that run's wall_s is not a measurement)",
    )
    ap.add_argument(
        "--idle-stacks",
        action="store_true",
        help="record the engine thread's stack whenever NVML sees the GPU idle mid-run "
        "(diagnostic; printed to bench.log and kept in the result JSON)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    ap.add_argument("--bandwidth", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--flops", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceilings = {"copy_bw_gbs": 0, "bf16_tflops": 0} if args.dry_run else measure_ceilings()
    print(json.dumps({"ceilings": ceilings, "git_commit": git_commit()}), flush=True)
    model_dir = model_folder(Path(args.tokenizer), args.shape)
    series = {}
    sampling_list = args.sampling.split(",")
    seqs_list = [str(seq_setting(v.strip())) for v in args.max_num_seqs.split(",")]
    tokens_list = [v.strip() for v in args.max_batch_tokens.split(",") if v.strip()] or [""]
    for workload in args.workloads.split(","):
        for engine in args.engines.split(","):
            requests = len(make_workload(workload, args.out_len, args.num_prompts))
            sweep = distinct_settings(seqs_list, requests)
            if sweep != seqs_list:
                print(f"{workload}: {requests} requests; not run: {set(seqs_list) - set(sweep)}")
            runs = run_list(engine, sampling_list, sweep, tokens_list)
            if args.dry_run:  # what would run, without a GPU (checked by the CPU tests)
                for eng, sampling, seqs, tokens in runs:
                    run = {"workload": workload, "engine": eng, "sampling": sampling}
                    print(json.dumps({**run, "max_num_seqs": seqs, "max_batch_tokens": tokens}))
                continue
            for eng, sampling, seqs, tokens in runs:
                tag = "" if len(seqs_list) == 1 else f"-seqs{seqs}"
                tag += f"-tokens{tokens}" if len(tokens_list) > 1 else ""
                result_path = out / f"{workload}-{eng}-{sampling}{tag}.json"
                out_len = (
                    args.hf_out_len
                    if eng.startswith("transformers") and workload == "blog"
                    else args.out_len
                )
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--workload",
                    workload,
                    "--engine",
                    eng,
                    "--result",
                    str(result_path),
                    "--model-dir",
                    str(model_dir),
                    "--out-len",
                    str(out_len),
                    "--max-num-seqs",
                    seqs,
                    "--max-model-len",
                    str(args.max_model_len),
                    "--hf-sample",
                    str(args.hf_sample),
                    "--sampling",
                    sampling,
                    "--shape",
                    args.shape,
                    *(["--profile-at", str(args.profile_at)] if args.profile_at else []),
                    *(["--idle-stacks"] if args.idle_stacks else []),
                    *(["--max-batch-tokens", tokens] if tokens else []),
                    "--bandwidth",
                    str(ceilings["copy_bw_gbs"] * 1e9),
                    "--flops",
                    str(ceilings["bf16_tflops"] * 1e12),
                ]
                if args.num_prompts:
                    cmd += ["--num-prompts", str(args.num_prompts)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(
                        json.dumps(
                            {
                                "workload": workload,
                                "engine": eng,
                                "max_num_seqs": seq_setting(seqs),
                                "error": proc.stderr[-3000:],
                            }
                        ),
                        flush=True,
                    )
                    continue
                r = json.loads(result_path.read_text())
                series[f"{workload}/{eng}/{sampling}{tag}"] = r.pop("series")
                line = {"workload": workload}
                if workload == "blog":
                    line["out_len"] = out_len
                line.update(
                    {
                        "shape": args.shape,
                        "engine": eng,
                        "sampling": sampling,
                        "wall_s": round(r["wall_s"], 2),
                        "out_tokens": r["out_tokens"],
                        "tok_per_s": round(r["out_tokens"] / r["wall_s"], 1),
                        "gpu_busy": round(r["gpu_busy"], 1),
                        "roofline_s": round(r["roofline_s"], 2),
                        "roofline_ratio": round(r["roofline_s"] / r["wall_s"], 3),
                        # The same with the decode GEMMs' FLOPs counted (bench_workloads.py).
                        "roofline_compute_ratio": round(r["roofline_compute_s"] / r["wall_s"], 3),
                        "peak_mem_gb": r["peak_mem_gb"],
                        "startup_s": r["startup_s"],
                        "num_prompts": r["num_prompts"],
                        "max_num_seqs": seq_setting(seqs),
                        **({"max_batch_tokens": int(tokens)} if tokens else {}),
                        "git_commit": git_commit(),
                        **env_fields(),
                    }
                )
                if "attention" in r:
                    line["attention"] = r["attention"]
                if eng.startswith("transformers"):
                    line["note"] = f"first {r['num_prompts']} prompts of the workload"
                for key in (
                    "stats_gpu_busy_pct",
                    "stats_gpu_busy_run_pct",
                    "stats_decode_bw_eff",
                    *STATS_KEYS,
                    "max_idle_gap_s",
                    "first_token_s",
                ):
                    if r.get(key) is not None:
                        line[key] = r[key]
                if r.get("gpu_busy_run") is not None:  # NVML's first busy sample to its last
                    line["gpu_busy_run"] = round(r["gpu_busy_run"], 1)
                if r.get("tensor_parallel", 1) > 1:
                    line["tensor_parallel"] = r["tensor_parallel"]
                    line["note"] = "roofline: the group's summed bandwidth and FLOP rate"
                if r.get("data_parallel"):
                    line["data_parallel"] = r["data_parallel"]
                    for key in ("end_gap_s", "worker_end_s", "worker_rows", "worker_gpu_busy_pct"):
                        line[key] = r.get(key)
                    line["note"] = "roofline: an even share of the rows on each worker's GPUs"
                if r.get("cached_prompt_tokens") is not None:
                    line["cached_prompt_tokens"] = r["cached_prompt_tokens"]
                prof = r.get("profile") or {}
                if prof.get("kernel_busy") is not None:
                    line["kernel_busy"] = prof["kernel_busy"]
                    (out / f"{workload}-{eng}-kernels.txt").write_text(prof["table"])
                for stack, count in r.get("idle_stacks") or []:
                    print(f"idle x{count}: {stack}", flush=True)
                print(json.dumps(line), flush=True)
                with open(out / "bench.jsonl", "a") as f:
                    f.write(json.dumps(line) + "\n")
    if series:
        save_series(series, out)


if __name__ == "__main__":
    main()
