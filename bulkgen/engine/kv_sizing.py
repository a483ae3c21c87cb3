"""How many KV-cache blocks a device holds: the memory left once the model, the largest steps'
activations and the CUDA graphs' pools have theirs (measured on CUDA with a warm-up pass of the
widest steps), or a fixed budget on the CPU. The same count on every tensor-parallel rank.

What is set aside, and why each is measured the way it is:
- activations: the peak of the warm-up plans run eagerly (warmup.py), the longest prefill and
  the widest sampling step with every filter on, logits and sampler temporaries included. Every
  step's logits and sampling run outside the graphs, from this memory.
- the decode graphs' pool: what the widest decode forward allocates up to the last hidden state,
  the part graphs.py captures. Its logits are not in the pool (they are activations' above):
  counted here too, a 1,024-row ceiling set aside 0.79 GB more than the graphs keep at the 8B
  shape's 128K vocabulary (by arithmetic: 1,024 x 128,256 x 6 bytes of bf16 logits and their
  float32 widening), 512 rows 0.39 GB, so `--max-num-seqs auto` held fewer blocks than 512 for
  no use (issue 16; on the H200's trt runs 436 and 437 rows at once before, 438 and 439 after).
- the mixed graphs' pool (mixed_graphs.py, on by default on one GPU): one piece's intermediates
  at a time, at most what a forward of max_batch_tokens allocates, again without logits.
- The two are one pool (runner.py: no tensor of it outlives a capture, one graph replays at a
  time), so the larger of the two is set aside, not their sum, and beside it the decode graphs'
  static output buffer (graph rows x hidden). With the sum, a 1,024-row ceiling (auto) set
  aside 0.075 GB more than 512 rows at the 8B shape: 34 blocks, a row fewer on trt (438 at once
  against 439, H200 at 88d02a8).
- 2 GiB for cuBLAS workspaces, the step buffers and the penalty state.
The cache then takes `kv_memory` of what is left.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from bulkgen.config import EngineConfig
from bulkgen.engine.plan import Plan
from bulkgen.engine.runner import ModelRunner, kv_bytes_per_block
from bulkgen.engine.warmup import fullest_step, warmup_blocks, warmup_plans, widest_decode
from bulkgen.model.llama import LlamaForCausalLM

CPU_KV_BUDGET = 2 << 30  # bytes of KV cache on the CPU when num_blocks is not given
HEADROOM = 2 << 30  # cuBLAS workspaces, the step buffers, the penalty state


@dataclass(frozen=True)
class KvSizing:
    """The cache's blocks and, when measured (CUDA, num_blocks not given), the bytes set aside
    before it (stats.json's kv_sizing_gb)."""

    blocks: int
    free: int = 0  # device memory free once the model is loaded
    activations: int = 0
    decode_graphs: int = 0
    mixed_graphs: int = 0
    decode_outputs: int = 0  # the decode graphs' static output buffer (graphs.py)
    headroom: int = 0

    @property
    def graph_pool(self) -> int:
        """The graphs' shared pool: the larger of the two forwards' peaks."""
        return max(self.decode_graphs, self.mixed_graphs)

    @property
    def set_aside(self) -> int:
        """Bytes kept from the cache before kv_memory's share of the rest."""
        return self.activations + self.graph_pool + self.decode_outputs + self.headroom

    @property
    def stats(self) -> dict:
        if not self.free:
            return {"kv_sizing_gb": None}
        fields = ("free", "activations", "decode_graphs", "mixed_graphs", "graph_pool",
                  "decode_outputs", "headroom")  # fmt: skip
        return {"kv_sizing_gb": {f: round(getattr(self, f) / 1e9, 3) for f in fields}}


def size_kv_cache(
    model: LlamaForCausalLM,
    cfg: EngineConfig,
    device: torch.device,
    kv_dtype: torch.dtype,
    max_model_len: int,
) -> KvSizing:
    """cfg.num_blocks if given, else the blocks that fit (on CUDA, measured after a warm-up pass
    of the largest steps); model.cfg is this rank's shape."""
    mcfg = model.cfg
    if cfg.num_blocks:
        return KvSizing(cfg.num_blocks)
    per_block = kv_bytes_per_block(mcfg, cfg.block_size, kv_dtype)
    if device.type != "cuda":
        want = cfg.seq_rows * max_model_len
        return KvSizing(max(1, min(CPU_KV_BUDGET // per_block, -(-want // cfg.block_size))))
    plans = warmup_plans(cfg, max_model_len)
    n = warmup_blocks(cfg, max_model_len)  # the probe's cache: the pools' plans wrap around it
    probe = ModelRunner(model, mcfg, cfg, device, n, max_model_len, graphs=False)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    probe.warm_up(plans)
    activations = torch.cuda.max_memory_allocated(device) - before
    decode = mixed = outputs = 0
    if cfg.cuda_graphs and model.attention.graph_safe:
        decode = forward_bytes(probe, widest_decode(cfg, n, sample=False), device)
        outputs = cfg.graph_rows * mcfg.hidden_size * model.model.embed_tokens.weight.element_size()
    if cfg.mixed_graphs and cfg.cuda_graphs:
        mixed = forward_bytes(probe, fullest_step(cfg, max_model_len, n, False), device)
    del probe
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    sizing = KvSizing(0, free, activations, decode, mixed, outputs, HEADROOM)
    budget = int((free - sizing.set_aside) * cfg.kv_memory)
    if budget < per_block:
        raise ValueError("no device memory left for the KV cache: lower --max-batch-tokens")
    blocks = model.tp.min(budget // per_block, device)  # the same cache on every rank
    return replace(sizing, blocks=blocks)


def forward_bytes(probe: ModelRunner, plan: Plan, device: torch.device) -> int:
    """Bytes a step's forward allocates at its peak, eagerly, as a graph's capture of it would
    (the plan samples no row: no logits)."""
    assert not plan.sampled, "a sampled row's logits are not the graph pool's"
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    forward = probe.forward(plan)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    probe.sample(forward).wait()
    return peak
