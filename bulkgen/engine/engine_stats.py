"""The engine's counters for stats.json: steps, preemption, cache, dtypes, host time per step,
batch sizes chosen and run, graph use, and the GPU monitor's figures."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from bulkgen.engine.monitor import step_time_stats
from bulkgen.model.switches import KERNEL_SWITCHES

if TYPE_CHECKING:
    from bulkgen.engine.engine import Engine


def engine_stats(engine: Engine) -> dict:
    return {
        "engine_steps": engine.num_steps,
        "preemptions": engine.scheduler.num_preemptions,
        "recomputed_tokens": engine.scheduler.num_recomputed,
        "kv_blocks": engine.scheduler.blocks.num_blocks,
        **engine.kv_sizing.stats,  # what was set aside before the cache (CUDA)
        "block_size": engine.cfg.block_size,
        "startup_s": round(engine.startup_s, 3),
        "device": str(engine.device),
        "tensor_parallel": engine.tp.size,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "quantization": engine.quantization,  # None, or how the weights are FP8
        "fp8_fast_accum": engine.cfg.fp8_fast_accum,
        "fp8_kv_pair_first_block": engine.cfg.fp8_kv_pair_first_block,
        "kv_cache_dtype": engine.kv_dtype_name,
        "batch_invariant": engine.cfg.batch_invariant,
        "kv_capacity_tokens": engine.scheduler.blocks.num_blocks * engine.cfg.block_size,
        "async_loop": engine.async_loop,
        "generated_tokens": engine.scheduler.num_generated,
        "cached_prompt_tokens": engine.scheduler.num_cached_tokens,
        **engine.host_times.stats,
        **engine.allocator.stats,
        **engine.gaps.stats,
        **engine.gc_pauses.stats,
        **step_time_stats(mask=engine.mask_s),
        "max_num_seqs": engine.cfg.max_num_seqs,
        **engine.scheduler.admission.stats,
        "max_running_seqs": engine.scheduler.max_running,
        "graph_max_batch": engine.runner.graphs.max_batch if engine.runner.graphs else 0,
        **(engine.runner.graphs.stats if engine.runner.graphs else {}),
        "decode_graph_steps": engine.runner.graph_steps,
        "eager_decode_steps": engine.runner.eager_decode_steps,
        # Steps with prefill through mixed_graphs.py's pieces (None: EngineConfig.mixed_graphs off)
        "mixed_graph_steps": engine.runner.mixed_graphs.steps
        if engine.runner.mixed_graphs
        else None,
        **(engine.monitor.stats if engine.monitor is not None else {}),
        "env_overrides": env_overrides(),
    }


def env_overrides() -> dict[str, str]:
    """The experimental switches set in the environment (switches.KERNEL_SWITCHES: BULKGEN_FP8_PDL,
    BULKGEN_SILU_FORM, BULKGEN_FP8_HW_ROUNDING, BULKGEN_PREFILL_F16, BULKGEN_BLAS,
    BULKGEN_BF16_ARGMAX, BULKGEN_ATTN_FP8_PV): a run's stats say which kernels it ran ({} when
    none is set). Only those: other BULKGEN_* variables (the cache folder, the CPU-thread
    decision a run passes to its children) choose no kernel."""
    return {k: os.environ[k] for k in sorted(KERNEL_SWITCHES) if k in os.environ}
