"""bulkgen as scripts/bench.py runs it: the whole `bulkgen run` pipeline on one GPU, with
`--data-parallel N` workers on N GPUs, or `--tensor-parallel N` over N GPUs (engine names
bulkgen-dpN, bulkgen-tpN, bulkgen-dpM-tpN), sampled by bench_measure.Sampler."""

from __future__ import annotations

import collections
import re
import tempfile
import time
from pathlib import Path

from bench_measure import Sampler

# The `json` sampling setting (issue 12): one 8-field schema for every row. Dummy weights write
# garbage, so the grammar masks most of the vocabulary at every step.
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "title": {"type": "string"},
        "summary": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "score": {"type": "number"},
        "level": {"enum": ["low", "medium", "high"]},
        "public": {"type": "boolean"},
        "notes": {"type": "string"},
    },
    "required": ["id", "title", "summary", "tags", "score", "level", "public", "notes"],
    "additionalProperties": False,
}


# stats.json fields every bulkgen run's result carries (bench.py copies them into its line).
STATS_KEYS = (
    "gpu_sm_clock_mhz_median",  # over NVML's busy samples (engine/monitor.py)
    "gpu_sm_clock_mhz_max",
    "gpu_power_w_median",
    "gpu_power_capped_pct",
    "gpu_thermal_pct",
    "host_ms_per_step_median",
    "host_ms_per_step_p99",
    "host_ms_per_step_max",
    "host_max_step",
    "host_decode_ms_per_step_median",
    "host_decode_ms_per_step_p99",
    "host_mixed_ms_per_step_median",
    "host_mixed_ms_per_step_p99",
    "host_schedule_ms_per_step_median",
    "host_schedule_ms_per_step_p99",
    "host_launch_ms_per_step_median",
    "host_launch_ms_per_step_p99",
    "host_update_ms_per_step_median",
    "host_update_ms_per_step_p99",
    "mask_ms_per_step_median",
    "mask_ms_per_step_p99",
    "preemptions",
    "recomputed_tokens",
    "eager_decode_steps",
    "max_num_seqs_chosen",
    "max_num_seqs_chosen_max",
    "max_num_seqs_ceiling",
    "max_running_seqs",
    "kv_blocks",
    "kv_sizing_gb",  # what the cache's sizing set aside (engine/kv_sizing.py)
    "graph_max_batch",
    "graph_buckets_replaced",
    "mixed_graph_steps",
    "host_mixed_launch_ms_per_step_median",
    "host_decode_launch_ms_per_step_median",  # wall, against the engine thread's CPU clock:
    "host_decode_launch_cpu_ms_per_step_median",  # the rest is waiting (host_times.py)
    "host_mixed_launch_cpu_ms_per_step_median",
    "alloc_retries",
    "alloc_syncs",
    "device_mallocs",
    "device_frees",
    "gc_collections",  # Python's collections in the run, by generation (gc_policy.py): a
    "gc_pause_s",  # collection holds every thread, the engine's too
    "gc_pause_max_ms",
    "gc_pauses_over_10ms",
    "gpu_gapless_pct",  # the GPU's clock: idle between steps (bulkgen/engine/gpu_gaps.py)
    "gpu_step_gaps_s",
    "gpu_step_gaps_before_mixed_s",
    "gpu_step_gap_max_ms",
    "gpu_step_gaps_over_1ms",
    "gpu_step_segments",
    "gpu_steps_span_s",
    "gpu_decode_steps_s",  # the GPU's time in each kind of step (gpu_gaps.py)
    "gpu_mixed_steps_s",
    "gpu_decode_ms_per_step_median",
    "gpu_mixed_ms_per_step_median",
    "gpu_mixed_ms_per_step_p99",
)

# Engine names that are `bulkgen run` options: FP8 weights; FP8 KV cache; both (issue 13); the
# int8 KV cache; the batch-invariant kernels (issue 15).
FP8 = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
ENGINE_OPTIONS = {
    "bulkgen-fp8w": {"quantization": "fp8"},
    "bulkgen-fp8kv": {"kv_cache_dtype": "fp8"},  # issue 16: auto on trt, against bf16 auto
    "bulkgen-fp8": FP8,
    # First blocks paired (kv_pairs.py: off by default since the long-text accuracy runs).
    "bulkgen-fp8-paired": FP8 | {"fp8_kv_pair_first_block": True},
    # The same with FP8 GEMMs summing exactly (--no-fp8-fast-accum; fast accumulation is the
    # default since 0cbf7c0's measurements, which ran it as engine bulkgen-fp8fa).
    "bulkgen-fp8exact": FP8 | {"fp8_fast_accum": False},
    "bulkgen-int8kv": {"kv_cache_dtype": "int8"},
    # Steps with prefill launched eagerly, not through mixed_graphs.py's pieces (the default on
    # one GPU since db9498e's measurements, which ran them as bulkgen-mixedgraphs).
    "bulkgen-eagermixed": {"mixed_graphs": False},
    "bulkgen-fp8-eagermixed": FP8 | {"mixed_graphs": False},
    "bulkgen-invariant": {"batch_invariant": True},  # issue 15's cost: compare with bulkgen
}


def engine_options(engine: str) -> dict:
    """The RunConfig options an engine name stands for (bulkgen-fp8w-dp2 as bulkgen-fp8w)."""
    return ENGINE_OPTIONS.get(re.split(r"-dp|-tp", engine, maxsplit=1)[0], {})


def data_parallel(engine: str) -> int:
    """Workers of an engine name: bulkgen-dp2 is `bulkgen run --data-parallel 2`."""
    found = re.search(r"-dp(\d+)", engine)
    return int(found.group(1)) if found else 1


def tensor_parallel(engine: str) -> int:
    """GPUs per engine of an engine name: bulkgen-tp2 is `bulkgen run --tensor-parallel 2`."""
    found = re.search(r"-tp(\d+)", engine)
    return int(found.group(1)) if found else 1


def seq_setting(value: str) -> int | str:
    """A --max-num-seqs value: a number, or auto."""
    return value if value == "auto" else int(value)


def run_list(
    engine: str, sampling: list[str], seqs: list[str], tokens: list[str]
) -> list[tuple[str, str, str, str]]:
    """(engine, sampling, max_num_seqs, max_batch_tokens) of each run one --engines entry stands
    for: transformers as its sync and async forms, greedy, at the first settings only; a bulkgen
    engine at every sampling setting, max_num_seqs and max_batch_tokens of the sweep."""
    engines = ["transformers-sync", "transformers-async"] if engine == "transformers" else [engine]
    runs = []
    for eng in engines:
        hf = eng.startswith("transformers")
        for setting in ["greedy"] if hf else sampling:
            for seq in seqs[:1] if hf else seqs:
                runs += [(eng, setting, seq, tok) for tok in (tokens[:1] if hf else tokens)]
    return runs


def distinct_settings(settings: list[str], requests: int) -> list[str]:
    """A sweep's settings without the numbers that cannot change a run: once one setting admits
    every request at once, a larger one runs the same requests the same way (400 requests at 512
    and at 1,024 gave 9,254 tok/s both, ec92f71: one of them was a minute spent for nothing).
    auto is always kept."""
    kept, covered = [], False
    for value in settings:
        if value != "auto" and int(value) >= requests:
            if covered:
                continue
            covered = True
        kept.append(value)
    return kept


def run_bulkgen(
    args,
    work,
    sync: bool,
    prefix_cache: bool = True,
    workers: int = 1,
    tp: int = 1,
    options: dict | None = None,
) -> dict:
    """The whole `bulkgen run` pipeline: Parquet of token-id prompts in, shards out. With
    workers > 1, `--data-parallel` worker processes on GPUs 0..workers * tp - 1; with tp > 1,
    each engine a tensor-parallel group of tp GPUs. options: more RunConfig fields
    (engine_options)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from bulkgen.config import SamplingParams
    from bulkgen.engine.engine import Engine
    from bulkgen.pipeline import run
    from bulkgen.run_config import RunConfig

    tmp = Path(tempfile.mkdtemp(prefix="bulkgen-bench-"))
    max_tokens = max(o for _, o in work)
    sampling = {
        "greedy": SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        "sample": SamplingParams(
            max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=1, ignore_eos=True
        ),
        "logprobs": SamplingParams(
            max_tokens=max_tokens, temperature=0.0, logprobs=5, ignore_eos=True
        ),
        "json": SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, json_schema=JSON_SCHEMA
        ),
    }[args.sampling]
    table = pa.table(
        {
            "id": [str(i) for i in range(len(work))],
            "prompt": [p for p, _ in work],
            "max_tokens": [o for _, o in work],
        }
    )
    pq.write_table(table, tmp / "prompts.parquet")
    config = RunConfig(
        inputs=(str(tmp / "prompts.parquet"),),
        out=str(tmp / "out"),
        model=str(args.model_dir),
        sampling=sampling,
        max_num_seqs=seq_setting(args.max_num_seqs),
        max_batch_tokens=int(args.max_batch_tokens) if args.max_batch_tokens else None,
        max_model_len=args.max_model_len,
        load_format="dummy",
        prefix_cache=prefix_cache,
        sync=sync,
        quiet=True,
        device="cuda",
        dtype="bfloat16",
        tensor_parallel=tp,
        **(options or {}),
    )
    gpus = list(range(workers * tp))
    if workers > 1:
        from bulkgen.parallel_local import run_local

        # The workers' engines are in their own processes: NVML busy over all their GPUs,
        # counted over wall_s from the moment they had all loaded (load_time_s), as for one
        # engine: not over the workers' exit after the last row (which had cut it to 80%).
        with Sampler(lambda: 0, gpus=gpus) as sampler:
            stats = run_local(config, workers)
        startup = stats["load_time_s"]
        return {
            "wall_s": stats["wall_time_s"],
            "out_tokens": stats["completion_tokens"],
            "gpu_busy": sampler.busy_after(startup, startup + stats["wall_time_s"]),
            "startup_s": round(startup, 1),
            "peak_mem_gb": None,
            "series": [],
            "rows": stats["rows"],
            "cached_prompt_tokens": sum(w.get("cached_prompt_tokens", 0) for w in stats["workers"]),
            "prefix_cache": prefix_cache,
            "data_parallel": workers,
            "tensor_parallel": tp,
            # Work sharing (issue 14): how far apart the workers ended (seconds after the parent
            # began handing out rows), the rows each took, and each one's own GPU busy.
            "end_gap_s": stats["data_parallel"].get("end_gap_s"),
            "worker_end_s": [w.get("end_s") for w in stats["workers"]],
            "worker_rows": [w.get("rows_handed") for w in stats["workers"]],
            "worker_gpu_busy_pct": [w.get("gpu_busy_pct") for w in stats["workers"]],
        }
    holder: dict = {}

    def factory(cfg):
        engine = Engine(cfg)
        holder["startup_s"] = engine.startup_s
        count = lambda: engine.scheduler.num_generated  # noqa: E731
        sampler = Sampler(
            count, profile_at=args.profile_at, gpus=gpus, idle_stacks=args.idle_stacks
        )
        holder["sampler"] = sampler.__enter__()
        return engine

    t0 = time.perf_counter()
    stats = run(config, engine_factory=factory)
    total = time.perf_counter() - t0
    holder["sampler"].__exit__()
    return {
        "wall_s": stats.get("wall_time_s", total - holder["startup_s"]),
        "out_tokens": stats["completion_tokens"],
        "gpu_busy": holder["sampler"].busy,
        "max_idle_gap_s": holder["sampler"].max_idle_gap_s,
        "gpu_busy_run": holder["sampler"].busy_run,
        "first_token_s": holder["sampler"].first_token_s,
        "startup_s": round(holder["startup_s"], 1),
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1),
        "series": holder["sampler"].series,
        "rows": stats["rows"],
        "profile": holder["sampler"].profile,
        "idle_stacks": (holder["sampler"].idle_stacks or collections.Counter()).most_common(12),
        "cached_prompt_tokens": stats.get("cached_prompt_tokens"),
        "prefix_cache": prefix_cache,
        "tensor_parallel": tp,
        # what stats.json tells a user: the engine's own NVML busy and decode bandwidth
        "stats_gpu_busy_pct": stats.get("gpu_busy_pct"),
        "stats_gpu_busy_run_pct": stats.get("gpu_busy_run_pct"),
        "stats_decode_bw_eff": stats.get("decode_bandwidth_efficiency"),
        **{k: stats.get(k) for k in STATS_KEYS},
    }
