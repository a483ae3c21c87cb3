"""How many KV-cache blocks a device holds: the memory left once the model, the largest steps'
activations and the decode graphs' pool have theirs (measured on CUDA with a warm-up pass of the
widest steps), or a fixed budget on the CPU. The same count on every tensor-parallel rank."""

from __future__ import annotations

import torch

from bulkgen.config import EngineConfig
from bulkgen.engine.runner import ModelRunner, kv_bytes_per_block
from bulkgen.engine.warmup import warmup_blocks, warmup_plans, widest_decode
from bulkgen.model.config import ModelConfig
from bulkgen.model.parallel_layers import TensorParallel

CPU_KV_BUDGET = 2 << 30  # bytes of KV cache on the CPU when num_blocks is not given


def auto_num_blocks(
    model,
    mcfg: ModelConfig,
    cfg: EngineConfig,
    device: torch.device,
    kv_dtype: torch.dtype,
    max_model_len: int,
    tp: TensorParallel,
) -> int:
    """KV blocks that fit: on CUDA, measured after a warm-up pass of the largest steps."""
    per_block = kv_bytes_per_block(mcfg, cfg.block_size, kv_dtype)
    if device.type != "cuda":
        want = cfg.seq_rows * max_model_len
        return max(1, min(CPU_KV_BUDGET // per_block, -(-want // cfg.block_size)))
    plans = warmup_plans(cfg, max_model_len)
    probe = ModelRunner(
        model,
        mcfg,
        cfg,
        device,
        warmup_blocks(cfg, max_model_len),
        max_model_len,
        graphs=False,
    )
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    probe.warm_up(plans)
    activations = torch.cuda.max_memory_allocated(device) - before
    graphs = cfg.cuda_graphs and model.attention.graph_safe
    graph_pool = _graph_pool_bytes(probe, cfg, device) if graphs else 0
    if cfg.mixed_graphs and cfg.cuda_graphs:
        graph_pool += activations  # mixed_graphs.py's pool: a piece's intermediates at most
    del probe
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    # Headroom: the warm-up's peak again (prefill steps allocate as they run), the decode
    # graphs' pool (at most what the widest decode forward allocates, its logits included:
    # the graphs keep their pool for the whole run, smaller graphs reuse the widest one's),
    # plus 2 GiB for cuBLAS workspaces, the step buffers and the penalty state.
    budget = int((free - activations - graph_pool - (2 << 30)) * cfg.kv_memory)
    if budget < per_block:
        raise ValueError("no device memory left for the KV cache: lower --max-batch-tokens")
    return tp.min(budget // per_block, device)  # the same cache on every rank


def _graph_pool_bytes(probe: ModelRunner, cfg: EngineConfig, device: torch.device) -> int:
    """Bytes the widest decode forward allocates (eagerly, as its graph's capture would)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    forward = probe.forward(widest_decode(cfg))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    probe.sample(forward).wait()
    return peak
