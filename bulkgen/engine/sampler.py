"""Token sampling on the device: greedy, temperature, top-k, top-p, min-p, seeded per row.

Randomness comes from a counter-based hash of (seed, position, token id), not from a generator
shared by the batch, so a seeded row samples the same token whatever its batch mates are and
however often it is recomputed after preemption. Sampling uses the exponential race
argmax(p_i / E_i) with E_i = -log(u_i), which draws i with probability p_i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bulkgen.config import SamplingParams
from bulkgen.model.switches import BF16_ARGMAX_ENV, switch

_MASK32 = 0xFFFFFFFF
# Plain greedy steps skip a [rows, vocab] float32 copy of their logits (0.146 ms at 400 rows of
# the 8B shape, 9141486's decode-step profile). On the H200 at 161440a the engine's GPU tests
# passed with it and bulk ran 11,177 / 16,897 tok/s (bf16 / FP8) against 11,152 / 16,784 without.
# BULKGEN_BF16_ARGMAX=0 turns it off.
BF16_ARGMAX = True


@dataclass
class SamplingTensors:
    """Per-row sampling parameters of one step, on the device."""

    temperature: torch.Tensor  # [B] float32; 0 = greedy
    top_k: torch.Tensor  # [B] int64; 0 = off
    top_p: torch.Tensor  # [B] float32; 1 = off
    min_p: torch.Tensor  # [B] float32; 0 = off
    seed: torch.Tensor  # [B] int64
    position: torch.Tensor  # [B] int64: index of the token being sampled in its sequence
    all_greedy: bool  # host flags from the plan: skip work nobody asked for
    any_filter: bool


def _fmix(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 values kept in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def uniform_noise(seed: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """u in (0, 1) for every (row, token id), a pure function of (seed, position, token id)."""
    lo, hi = seed & _MASK32, (seed >> 32) & _MASK32
    row = _fmix(_fmix(lo ^ _fmix(hi + 0x9E3779B9)) ^ (position & _MASK32))  # [B]
    token = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)
    h = _fmix(row[:, None] ^ ((token[None, :] * 0x27D4EB2F) & _MASK32))
    h = _fmix(h + 0x165667B1)
    # 23 bits, not 24: ((2**24 - 1) + 0.5) / 2**24 rounds to exactly 1.0 in float32, and u = 1
    # makes -log(u) = 0: that token's race value became inf (drawn whatever its probability) or,
    # for a masked or filtered token, 0/0 = NaN, which argmax picks (seen: a grammar-masked token
    # sampled). With 23 bits the largest u is 1 - 2**-24, exactly representable.
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


def apply_filters(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Mask (to -inf) tokens outside top-k, top-p and min-p, in that order."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(st.top_k > 0, st.top_k.clamp(max=vocab), vocab)
    ranks = torch.arange(vocab, device=logits.device)
    keep_sorted = ranks[None, :] < k[:, None]
    sorted_logits = sorted_logits.masked_fill(~keep_sorted, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Keep a token if the mass strictly before it is below top_p (the first always stays).
    before = probs.cumsum(dim=-1) - probs
    keep_sorted &= before < st.top_p[:, None]
    keep_sorted &= probs >= st.min_p[:, None] * probs[:, :1]
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [B, V] from an int32 [B, ceil(V / 32)] bitmask: bit j of word w is token 32 * w + j."""
    bits = torch.arange(32, device=words.device, dtype=torch.int32)
    unpacked = (words[:, :, None] >> bits) & 1
    return unpacked.flatten(1)[:, :vocab_size].bool()


def float_logits(params: list[SamplingParams], batch_invariant: bool = False) -> bool:
    """Whether a step's logits are widened to float32 (compute_logits' widen): always, unless
    every sampled row is plain greedy (no penalty, logprobs or grammar), whose token is the
    argmax of the lm_head's 16-bit logits as of their exact float32 widening (BF16_ARGMAX; the
    batch-invariant mode always widens)."""
    if batch_invariant or not switch(BF16_ARGMAX_ENV, BF16_ARGMAX):
        return True
    plain = (
        p.greedy and not p.penalized and p.logprobs is None and not p.constrained for p in params
    )
    return not all(plain)


def sample(
    logits: torch.Tensor, st: SamplingTensors, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Token ids [B] int64 for float32 logits [B, V].

    allowed, a bool [B, V] mask, restricts the distribution to the allowed tokens before anything
    else: greedy rows take the allowed argmax and the filters see only allowed tokens.
    """
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    greedy_ids = logits.argmax(dim=-1)
    if st.all_greedy:
        return greedy_ids
    temperature = torch.where(st.temperature > 0, st.temperature, 1.0)
    scaled = logits / temperature[:, None]
    if st.any_filter:
        scaled = apply_filters(scaled, st)
    probs = scaled.softmax(dim=-1)
    race = probs / -torch.log(uniform_noise(st.seed, st.position, logits.shape[-1]))
    return torch.where(st.temperature > 0, race.argmax(dim=-1), greedy_ids)


def row_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """logsumexp over each row of [B, V] -> [B], summed in an order that does not depend on B
    (torch's own CUDA reduction picks its layout from the number of rows: triton_logprobs.py)."""
    if logits.is_cuda:
        from bulkgen.engine.triton_logprobs import logsumexp_rows

        return logsumexp_rows(logits.float())
    # One [V] reduction per row, on a fresh (aligned) copy: the same operation on the same shape
    # and alignment whatever the batch. The sum is a float64 cumsum, which runs serially along
    # the row whatever the thread count (torch's logsumexp splits a row between threads, so its
    # last bit followed the count, which bulkgen picks from the machine's load).
    rows = [_serial_logsumexp(row.clone().float()) for row in logits]
    return torch.stack(rows) if rows else logits.sum(-1)


def _serial_logsumexp(row: torch.Tensor) -> torch.Tensor:
    top = row.max()
    total = torch.cumsum((row - top).exp(), 0, dtype=torch.float64)[-1]
    return (top.double() + total.log()).float()


def top_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, k: int, batch_invariant: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of the model's distribution: of the sampled ids [B], and the top k.

    One logsumexp and one top-k over the logits: no [B, V] log-softmax is written. With
    batch_invariant a row's logprobs do not depend on its batch mates (row_logsumexp; the top-k
    values are exact, only the order of exactly tied logits may follow the batch).
    """
    lse = row_logsumexp(logits) if batch_invariant else logits.logsumexp(dim=-1)
    chosen = logits.gather(1, ids[:, None]).squeeze(1) - lse
    if k == 0:
        return chosen, ids[:, None][:, :0], logits[:, :0]
    top_vals, top_ids = logits.topk(k, dim=-1)
    return chosen, top_ids, top_vals - lse[:, None]
