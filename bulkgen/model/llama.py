"""The Llama family in one file: Llama 2/3.x, Mistral, Qwen2/2.5 (QKV bias), Qwen3 (q/k norm).

Tokens of a step arrive flattened ([T]) with their positions; attention reads and writes the paged
KV cache (passed to forward: one (k, v) pair of [blocks, block_size, kv_heads, head_dim] tensors
per layer) through the backend chosen at construction and the AttnMetadata of the step. Parameter
names follow Hugging Face's except for the fused qkv_proj and gate_up_proj.

Under tensor parallelism (parallel_layers.py) cfg is one rank's narrower shape (local_config) and
`tp` adds the all-reduce after o_proj and down_proj and the vocab-parallel embedding and logits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

import torch
from torch import nn

from bulkgen.model.attention import AttentionBackend
from bulkgen.model.attention.decode_rotary import Unrotated, defers
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.config import ModelConfig
from bulkgen.model.fp8 import Fp8Activation, Fp8Linear
from bulkgen.model.parallel_layers import TensorParallel, VocabParallelEmbedding
from bulkgen.model.switches import ATTN_ROWS_ENV, switch


class RMSNorm(nn.Module):
    """Holds the weight; the arithmetic is ops.rms_norm / ops.add_rms_norm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if cfg.rope_scaling is None:
        return inv_freq
    s = dict(cfg.rope_scaling)  # llama3: shrink low frequencies, blend the middle band
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos/sin for every position, computed once in float32 and indexed by position."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.cos = self.sin = torch.empty(0)

    def build(self, device: torch.device) -> None:
        """Fill the tables on the device (the model itself is built on the meta device)."""
        inv_freq = rope_inv_freq(self.cfg)
        positions = torch.arange(self.cfg.max_position_embeddings).float()
        freqs = torch.outer(positions, inv_freq).to(device)
        self.cos, self.sin = freqs.cos(), freqs.sin()


class Attention(nn.Module):
    def __init__(
        self, cfg: ModelConfig, backend: AttentionBackend, ops: SimpleNamespace, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        self.backend = backend
        self.ops = ops
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5
        # An fp8 KV cache's scales (kv_fp8.py): 1.0 unless the checkpoint has calibrated ones.
        self.k_scale = self.v_scale = 1.0

    def qkv_cache(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        rotary: Rotary,
        kv: tuple[torch.Tensor, ...],
        q_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The rotated queries [T, heads, head_dim] (in q_out when given); keys and values are
        written to the cache (at meta.slot_mapping: the only metadata read here)."""
        cfg = self.cfg
        q, k, v = self.qkv_proj(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(-1, cfg.num_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:  # per head, over head_dim
            q = self.ops.rms_norm(q, self.q_norm.weight, cfg.rms_norm_eps)
            k = self.ops.rms_norm(k, self.k_norm.weight, cfg.rms_norm_eps)
        # An int8 cache comes with its scale tensors (kv_int8.py), which replace the floats.
        k_cache, v_cache, *scales = kv
        k_scale, v_scale = scales if scales else (self.k_scale, self.v_scale)
        cache = (k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        # An fp8 cache's first-block partners (attention/kv_pairs.py), where there are any.
        pairs = {} if meta.kv_partners is None else {"partners": meta.kv_partners}
        if self.defers_rotary(meta, q, q_out, k_cache):  # the decode launch does both
            return Unrotated(q, k, v, positions, rotary.cos, rotary.sin, meta.slot_mapping)
        if self.backend.rotary_write_kv is not None:  # one launch, the same bits
            args = (q, k, v, positions, rotary.cos, rotary.sin, *cache)
            runs = not meta.decode_only  # a step with prefill: values stored in runs
            return self.backend.rotary_write_kv(*args, q_out=q_out, v_runs=runs, **pairs)[0]
        q, k = self.ops.rotary(q, k, positions, rotary.cos, rotary.sin)
        self.backend.write_kv(k, v, *cache, **pairs)
        return q if q_out is None else q_out.copy_(q)

    def defers_rotary(self, meta: AttnMetadata, q, q_out, k_cache: torch.Tensor) -> bool:
        """Whether qkv_cache leaves the rotary and the cache write to attend's decode launch
        (decode_rotary.py): a decode-only step of a backend that can, outside mixed_graphs'
        pieces (q_out), of few rows, with a cache it can write (not int8, no paired blocks)."""
        if not self.backend.decode_rotary or not meta.decode_only or q_out is not None:
            return False
        return defers(k_cache, meta.kv_partners is not None, q.shape[0])

    def attend(
        self,
        q: torch.Tensor | Unrotated,
        meta: AttnMetadata,
        kv: tuple[torch.Tensor, ...],
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of the queries over the cache: [T, heads, head_dim] (in out when given);
        queries qkv_cache left unrotated are rotated, and their keys and values written, by
        the decode launch."""
        k_cache, v_cache, *scales = kv
        k_scale, v_scale = scales if scales else (self.k_scale, self.v_scale)
        rotate = {"rotate": q} if isinstance(q, Unrotated) else {}
        q = q.q if rotate else q
        args = (q, k_cache, v_cache, meta, self.scale, k_scale, v_scale)
        if out is None and self.fp8_rows():  # a decode step's output may come as FP8 rows
            return self.backend.attend_fp8_rows(*args, **rotate)
        return self.backend.attend(*args, out=out, **rotate)

    def fp8_rows(self) -> bool:
        """Whether attention may hand o_proj its input as FP8 rows (unless BULKGEN_FP8_ATTN_ROWS=0):
        o_proj quantizes its input per row itself, and the backend can."""
        o_proj, backend = self.o_proj, self.backend
        if backend.attend_fp8_rows is None or not switch(ATTN_ROWS_ENV, True):
            return False
        dynamic = isinstance(o_proj, Fp8Linear) and o_proj.input_scale is None
        return dynamic and o_proj.bias is None and o_proj.use_scaled_mm

    def project(self, o: torch.Tensor | Fp8Activation) -> torch.Tensor:
        """o_proj of the attention output [T, heads, head_dim], or of its FP8 rows."""
        rows = o if isinstance(o, Fp8Activation) else o.reshape(-1, self.cfg.q_size)
        return self.tp.all_reduce(self.o_proj(rows))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: SimpleNamespace, tp: TensorParallel) -> None:
        super().__init__()
        self.ops = ops
        self.tp = tp
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ops.gate_up_silu(self.gate_up_proj, x)  # FP8 ops may make it one GEMM
        return self.tp.all_reduce(self.down_proj(h))


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, backend: AttentionBackend, ops: SimpleNamespace, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.ops = ops
        self.self_attn = Attention(cfg, backend, ops, tp)
        self.mlp = MLP(cfg, ops, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    # A layer is begin (up to the queries, keys and values in the cache), attention, end; the
    # model's forward runs the three in turn, and engine/mixed_graphs.py captures what lies
    # between two attentions (one layer's end and the next one's begin) in CUDA graphs.
    def begin(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttnMetadata,
        rotary: Rotary,
        kv: tuple[torch.Tensor, ...],
        q_out: torch.Tensor | None = None,
        residual_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) -> (queries, the residual stream h + residual); the queries in q_out
        and the stream in residual_out when given. Keeping the residual apart lets each add
        share one kernel with the norm after it."""
        norm1 = self.input_layernorm
        if residual is None:
            x, residual = self.ops.rms_norm(h, norm1.weight, norm1.eps), h
            residual = residual if residual_out is None else residual_out.copy_(residual)
        else:
            args = (h, residual, norm1.weight, norm1.eps)
            x, residual = self.ops.add_rms_norm(*args, residual_out=residual_out)
        return self.self_attn.qkv_cache(x, positions, meta, rotary, kv, q_out), residual

    def end(self, o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention output, residual) -> (mlp output, residual before it); the sum is the
        layer's output."""
        norm2 = self.post_attention_layernorm
        h = self.self_attn.project(o)
        x, residual = self.ops.add_rms_norm(h, residual, norm2.weight, norm2.eps)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(
        self, cfg: ModelConfig, backend: AttentionBackend, ops: SimpleNamespace, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        layers = (DecoderLayer(cfg, backend, ops, tp) for _ in range(cfg.num_layers))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        ops: SimpleNamespace,
        tp: TensorParallel | None = None,
    ) -> None:
        """cfg: this rank's shape (parallel_layers.local_config) when tp.size > 1."""
        super().__init__()
        tp = tp or TensorParallel()
        self.cfg = cfg
        self.ops = ops
        self.tp = tp
        self.attention = backend
        self.model = LlamaModel(cfg, backend, ops, tp)
        self.rotary = Rotary(cfg)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            rows = self.model.embed_tokens.rows  # this rank's rows of the vocabulary
            self.lm_head = nn.Linear(cfg.hidden_size, rows, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        kv_cache: Sequence[tuple[torch.Tensor, ...]],
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm; kv_cache holds one (k, v) per layer
        ((k, v, k_scales, v_scales) for an int8 cache)."""
        h, residual = self.model.embed_tokens(input_ids), None
        for layer, kv in zip(self.model.layers, kv_cache, strict=True):
            q, residual = layer.begin(h, residual, positions, meta, self.rotary, kv)
            h, residual = layer.end(layer.self_attn.attend(q, meta, kv), residual)
        return self.final_norm(h, residual)

    def final_norm(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        norm = self.model.norm
        return self.ops.add_rms_norm(h, residual, norm.weight, norm.eps)[0]

    def compute_logits(self, hidden: torch.Tensor, widen: bool = True) -> torch.Tensor:
        """Float32 logits [T, vocab] (gathered from every rank under tensor parallelism); in the
        weights' dtype when not `widen`."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return self.model.embed_tokens.logits(hidden, weight, widen)
