"""Repetition, presence and frequency penalties on a batch of logits, from per-row token state.

Each row of the batch carries two [V] tensors of state: how many times each token occurs in its
output so far (`counts`, int32) and which tokens occur in its prompt (`prompt_mask`, bool).
Semantics, per row:

- repetition_penalty (Hugging Face's RepetitionPenaltyLogitsProcessor, as vLLM has it): every
  token seen in the prompt or the output has its logit divided by the penalty when positive and
  multiplied by it otherwise. 1.0 is off.
- presence_penalty and frequency_penalty (OpenAI's, as vLLM has them), over output tokens only:
  logit -= presence * (count > 0) + frequency * count. 0.0 is off.

Repetition is applied first, then presence and frequency. A row with every penalty off comes out
bit for bit as it went in, so a batch may mix penalized and plain rows. Everything here is
elementwise or a scatter over tensors of fixed shape: no host synchronisation, no shape that
depends on the data, so it runs inside a CUDA graph (and under torch.compile) as it is.
"""

from __future__ import annotations

import torch


def apply_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> torch.Tensor:
    """Penalized logits (a new tensor).

    logits [B, V] float; counts [B, V] int32 (each row's output-token counts); prompt_mask [B, V]
    bool (tokens in the row's prompt); repetition, presence, frequency [B] float32.
    """
    assert logits.shape == counts.shape == prompt_mask.shape, "one [B, V] state per row"
    in_output = counts > 0
    rep = repetition.to(logits.dtype).unsqueeze(1)
    repeated = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(in_output | prompt_mask, repeated, logits)
    presence = presence.to(logits.dtype).unsqueeze(1)
    frequency = frequency.to(logits.dtype).unsqueeze(1)
    return logits - presence * in_output.to(logits.dtype) - frequency * counts.to(logits.dtype)


def count_tokens(counts: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor) -> None:
    """Add one step's sampled tokens to the output counts, in place: counts[slots[i], ids[i]] += 1.

    counts [S, V] int32 (a state row per slot); slots, ids [B] int64. Rows that must not count
    (padding in a graph batch) should point at a scratch slot.
    """
    flat = slots * counts.shape[1] + ids
    counts.view(-1).scatter_add_(0, flat, torch.ones_like(flat, dtype=counts.dtype))


def fill_state(
    counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    slot: int,
    prompt_ids: torch.Tensor,
    output_ids: torch.Tensor | None = None,
) -> None:
    """Set a slot's state for a request taking it: its prompt's tokens, and the output tokens it
    already has (a request re-admitted after preemption keeps them). prompt_ids, output_ids [L]
    int64 on the state's device."""
    prompt_mask[slot].zero_()
    prompt_mask[slot].index_fill_(0, prompt_ids, True)
    counts[slot].zero_()
    if output_ids is not None and output_ids.numel():
        counts[slot].scatter_add_(0, output_ids, torch.ones_like(output_ids, dtype=counts.dtype))
