"""The peer in scripts/bench.py: transformers' own continuous batching on the same workload.

It runs `paged|sdpa` on the GPU machine (no flash-attn there). Its manager is entered (graph
capture, cache sizing from workload hints) before the timer starts, as bulkgen's startup is.
"""

from __future__ import annotations

import time

from bench_measure import Sampler

from bulkgen.model.shapes import LLAMA3_8B


def run_transformers(args, work, use_async: bool, device: str = "cuda", shape=None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    t0 = time.perf_counter()
    shape = shape or LLAMA3_8B
    config = LlamaConfig(**{k: v for k, v in shape.items() if k != "architectures"})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation="paged|sdpa"
        ).eval()
    gen = GenerationConfig(
        max_new_tokens=max(o for _, o in work), do_sample=False, eos_token_id=None, pad_token_id=0
    )
    cb = ContinuousBatchingConfig(use_cuda_graph=device == "cuda", use_async_batching=use_async)
    produced = [0]
    try:  # sizes the cache for the workload, as generate_batch does
        from transformers.generation.continuous_batching.utils import WorkloadHints

        hints = WorkloadHints(
            max_prompt_length=max(len(p) for p, _ in work),
            max_generated_length=max(o for _, o in work),
            num_requests=len(work),
        )
    except (ImportError, TypeError):
        hints = None
    # Entering the context warms up (captures graphs) before the timer starts.
    with model.continuous_batching_context_manager(
        generation_config=gen,
        continuous_batching_config=cb,
        block=True,
        timeout=30,
        workload_hints=hints,
    ) as manager:
        startup = time.perf_counter() - t0
        with Sampler(lambda: produced[0]) as sampler:
            t1 = time.perf_counter()
            for i, (p, o) in enumerate(work):
                manager.add_request(p, request_id=str(i), max_new_tokens=o)
            for _ in range(len(work)):
                res = manager.get_result(timeout=600)
                if res is None:
                    break
                produced[0] += len(res.generated_tokens)
        wall = time.perf_counter() - t1
    return {
        "wall_s": round(wall, 2),
        "out_tokens": produced[0],
        "gpu_busy": sampler.busy,
        "startup_s": round(startup, 1),
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1) if device == "cuda" else 0,
        "series": sampler.series,
        "attention": "paged|sdpa (no flash-attn on this machine)",
    }
