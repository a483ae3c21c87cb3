"""Tensor parallelism inside the model: which slice of each weight a rank holds, and the
collectives that join the slices (one all-reduce after each row-parallel projection).

    qkv_proj, gate_up_proj   column-parallel: each rank holds its heads / its part of the MLP
    o_proj, down_proj        row-parallel: each rank's partial sums, then one all-reduce
    embed_tokens, lm_head    vocab-parallel: each rank holds ceil(V / N) rows of the vocabulary;
                             the embedding sums the one rank's row that holds a token, the
                             logits are gathered from every rank

A rank's model is the single-GPU model of a narrower shape (local_config: heads, KV heads and
intermediate size divided by N), so attention, the KV cache and the fused ops need no change.
KV heads are split across ranks, or replicated when N exceeds them (each rank then holds the one
KV head its query heads read). With N = 1 every collective is the identity.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bulkgen.model.config import ModelConfig


@dataclass(frozen=True)
class TensorParallel:
    """Rank `rank` of `size` in the default torch.distributed group (one group per process)."""

    rank: int = 0
    size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place. On CUDA it is enqueued on the current stream (and
        captured into a CUDA graph when one is being captured): the host never waits."""
        if self.size > 1:
            torch.distributed.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., size * n], rank 0's columns first."""
        if self.size == 1:
            return x
        x = x.contiguous()
        out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))  # ranks along dim 0
        dist = torch.distributed
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, x)
        out = out.view(self.size, *x.shape)
        return out.movedim(0, -2).reshape(*x.shape[:-1], self.size * x.shape[-1])

    def min(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's value (a host read: for setup, never in a step)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return int(t.item())

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's values into x on every rank, in place."""
        if self.size > 1:
            torch.distributed.broadcast(x, src=0)
        return x


def check_shape(cfg: ModelConfig, size: int) -> None:
    """ValueError unless this model splits over `size` ranks."""
    if size < 1:
        raise ValueError(f"--tensor-parallel must be >= 1, got {size}")
    if size == 1:
        return
    heads, kv = cfg.num_heads, cfg.num_kv_heads
    if heads % size:
        raise ValueError(
            f"--tensor-parallel {size} does not divide the model's {heads} attention heads; "
            "pick a divisor of it"
        )
    if (kv % size) if size <= kv else (size % kv):
        raise ValueError(
            f"--tensor-parallel {size} and the model's {kv} KV heads: one must divide the other"
        )
    if cfg.intermediate_size % size:
        raise ValueError(
            f"--tensor-parallel {size} does not divide the model's MLP width "
            f"{cfg.intermediate_size}; pick a divisor of it"
        )


def local_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The shape of one rank's model: its heads, KV heads and MLP columns."""
    if size == 1:
        return cfg
    check_shape(cfg, size)
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // size,
        num_kv_heads=max(1, cfg.num_kv_heads // size),
        intermediate_size=cfg.intermediate_size // size,
    )


def vocab_rows(vocab_size: int, size: int) -> int:
    """Rows of the vocabulary each rank holds (the last rank's tail is padding)."""
    return -(-vocab_size // size)


@dataclass(frozen=True)
class WeightShard:
    """Where rank `rank` of `size` reads each Hugging Face weight: (dim, start, length), or None
    for a weight every rank holds whole (norms)."""

    cfg: ModelConfig  # the full model
    rank: int
    size: int

    def slice_of(self, hf_name: str) -> tuple[int, int, int] | None:
        cfg, r, n = self.cfg, self.rank, self.size
        if n == 1:
            return None
        part = hf_name.split(".")[-2] if hf_name.count(".") else hf_name
        local = local_config(cfg, n)
        d = cfg.head_dim
        if part == "q_proj":
            return 0, r * local.q_size, local.q_size
        if part in ("k_proj", "v_proj"):
            # With N > KV heads, ranks r*kv//N share a KV head: the one their query heads read.
            first = r * cfg.num_kv_heads // n
            return 0, first * d, local.kv_size
        if part in ("gate_proj", "up_proj"):
            return 0, r * local.intermediate_size, local.intermediate_size
        if part == "o_proj":
            return 1, r * local.q_size, local.q_size
        if part == "down_proj":
            return 1, r * local.intermediate_size, local.intermediate_size
        if part in ("embed_tokens", "lm_head"):
            rows = vocab_rows(cfg.vocab_size, n)
            start = min(r * rows, cfg.vocab_size)
            return 0, start, min(rows, cfg.vocab_size - start)
        return None  # norms: whole on every rank


class VocabParallelEmbedding(nn.Module):
    """Rows [rank * V/N, (rank + 1) * V/N) of the embedding table; also the tied lm_head."""

    def __init__(self, vocab_size: int, hidden: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.rows = vocab_rows(vocab_size, tp.size)
        self.start = tp.rank * self.rows
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(self.rows, hidden))
        # The logits' GEMM; invariant.make_batch_invariant swaps in its invariant_linear.
        self.linear = F.linear

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        h = F.embedding(local.masked_fill(outside, 0), self.weight)
        # Each token's row lives on one rank: the others contribute zeros to the sum.
        return self.tp.all_reduce(h.masked_fill(outside.unsqueeze(-1), 0.0))

    def logits(
        self, hidden: torch.Tensor, weight: torch.Tensor, widen: bool = True
    ) -> torch.Tensor:
        """Float32 logits [T, V] from this rank's rows of `weight` (the table or the head); in the
        weights' dtype when not `widen` (sampler.float_logits)."""
        # Gathered in the weights' dtype (half the bytes of float32), widened after: exact.
        local = self.linear(hidden, weight)
        logits = self.tp.all_gather_last(local)[..., : self.vocab_size]
        return logits.float() if widen else logits
