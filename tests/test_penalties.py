"""Penalties: Hugging Face's repetition penalty and OpenAI's presence/frequency penalties."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bulkgen.config import SamplingParams
from bulkgen.engine.penalties import apply_penalties, count_tokens, fill_state

V = 40


def batch(seed: int, b: int = 6):
    """Random logits, prompts and outputs (token lists) of b rows, and their state tensors."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, V, generator=g) * 3
    logits[0, 5] = 0.0  # a zero logit among the seen tokens below
    prompts = [
        torch.randint(0, V, (int(n),), generator=g) for n in torch.randint(1, 20, (b,), generator=g)
    ]
    outputs = [
        torch.randint(0, V, (int(n),), generator=g) for n in torch.randint(0, 30, (b,), generator=g)
    ]
    prompts[0] = torch.cat([prompts[0], torch.tensor([5])])
    counts = torch.zeros(b, V, dtype=torch.int32)
    mask = torch.zeros(b, V, dtype=torch.bool)
    for i in range(b):
        fill_state(counts, mask, i, prompts[i], outputs[i])
    return logits, prompts, outputs, counts, mask


def reference_hf(logits, prompts, outputs, rep):
    """transformers' RepetitionPenaltyLogitsProcessor, row by row (its input: prompt + output)."""
    from transformers import RepetitionPenaltyLogitsProcessor

    rows = []
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        ids = torch.cat([prompt, output]).unsqueeze(0)
        rows.append(RepetitionPenaltyLogitsProcessor(float(rep[i]))(ids, logits[i : i + 1].clone()))
    return torch.cat(rows)


def test_repetition_penalty_is_hugging_faces():
    logits, prompts, outputs, counts, mask = batch(0)
    rep = torch.tensor([1.3, 0.7, 2.0, 1.0, 1.05, 5.0])
    got = apply_penalties(logits, counts, mask, rep, torch.zeros(6), torch.zeros(6))
    assert torch.equal(got, reference_hf(logits, prompts, outputs, rep))


def reference_openai(logits, outputs, presence, frequency):
    out = logits.double().clone()
    for i, ids in enumerate(outputs):
        for token in set(ids.tolist()):
            out[i, token] -= presence[i] + frequency[i] * ids.tolist().count(token)
    return out.float()


def test_presence_and_frequency_penalties_are_openais_over_output_tokens():
    logits, _, outputs, counts, mask = batch(1)
    presence = torch.tensor([0.5, -1.0, 2.0, 0.0, 0.3, -2.0])
    frequency = torch.tensor([0.2, 0.0, -0.5, 1.5, 2.0, 0.1])
    got = apply_penalties(logits, counts, mask, torch.ones(6), presence, frequency)
    torch.testing.assert_close(got, reference_openai(logits, outputs, presence, frequency))


def test_all_three_apply_repetition_first():
    logits, prompts, outputs, counts, mask = batch(2)
    rep, presence, frequency = torch.full((6,), 1.2), torch.full((6,), 0.4), torch.full((6,), 0.3)
    got = apply_penalties(logits, counts, mask, rep, presence, frequency)
    hf = reference_hf(logits, prompts, outputs, rep)
    torch.testing.assert_close(got, reference_openai(hf, outputs, presence, frequency))


def test_rows_with_penalties_off_are_unchanged_bit_for_bit():
    logits, _, _, counts, mask = batch(3)
    logits[1, 3] = -math.inf  # a token masked out before (a constraint, say) stays masked
    rep = torch.tensor([1.0, 1.0, 1.5, 1.0, 1.0, 1.0])
    presence = torch.tensor([0.0, 0.0, 0.0, 0.7, 0.0, 0.0])
    got = apply_penalties(logits, counts, mask, rep, presence, torch.zeros(6))
    plain = [0, 1, 4, 5]
    assert torch.equal(got[plain], logits[plain])
    assert not torch.equal(got[2], logits[2]) and not torch.equal(got[3], logits[3])


def test_count_tokens_adds_each_rows_sampled_token_to_its_slot():
    counts = torch.zeros(4, V, dtype=torch.int32)
    count_tokens(counts, torch.tensor([2, 0, 3]), torch.tensor([7, 7, 1]))
    count_tokens(counts, torch.tensor([2, 0]), torch.tensor([7, 9]))
    want = torch.zeros(4, V, dtype=torch.int32)
    want[2, 7], want[0, 7], want[3, 1], want[0, 9] = 2, 1, 1, 1
    assert torch.equal(counts, want)


def test_fill_state_resets_a_reused_slot():
    counts, mask = torch.ones(2, V, dtype=torch.int32), torch.ones(2, V, dtype=torch.bool)
    fill_state(counts, mask, 1, torch.tensor([3, 4]), torch.tensor([4, 4, 8]))
    assert mask[1].nonzero().flatten().tolist() == [3, 4]
    assert counts[1].nonzero().flatten().tolist() == [4, 8] and counts[1, 4] == 2
    assert counts[0].all() and mask[0].all(), "other slots are left alone"


# Ops that read a value back to the host or give a shape that depends on the data.
SYNCING_OPS = ("_local_scalar_dense", "nonzero", "unique", "masked_select", "bincount", "item")
SYNCING_OPS += ("aten.index.Tensor",)  # what indexing by a boolean mask dispatches as


class OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_penalties_need_no_host_sync_and_no_data_dependent_shape():
    """What breaks a CUDA graph on the GPU shows on the CPU as the ops dispatched."""
    logits, _, _, counts, mask = batch(4)
    with OpLog() as log:
        apply_penalties(logits, counts, mask, torch.ones(6), torch.zeros(6), torch.ones(6))
        count_tokens(counts, torch.arange(6), torch.zeros(6, dtype=torch.long))
    bad = [op for op in log.ops if any(name in op for name in SYNCING_OPS)]
    assert log.ops and not bad, bad


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("repetition_penalty", float("nan"), "repetition_penalty must be a number in"),
        ("repetition_penalty", 0.0, "repetition_penalty must be a number in"),
        ("repetition_penalty", -1.2, "repetition_penalty must be a number in"),
        ("repetition_penalty", float("inf"), "repetition_penalty must be a number in"),
        ("presence_penalty", 2.5, "presence_penalty must be a number in [-2, 2]"),
        ("presence_penalty", float("nan"), "presence_penalty must be a number in [-2, 2]"),
        ("frequency_penalty", -3, "frequency_penalty must be a number in [-2, 2]"),
        ("frequency_penalty", float("-inf"), "frequency_penalty must be a number in [-2, 2]"),
        ("frequency_penalty", "0.5", "frequency_penalty must be a number in [-2, 2]"),
    ],
)
def test_bad_penalties_are_value_errors_naming_the_field_and_range(field, value, words):
    with pytest.raises(ValueError, match=re.escape(words) + ".*got " + re.escape(repr(value))):
        SamplingParams(**{field: value})


def test_penalized_says_whether_any_penalty_is_on():
    assert not SamplingParams().penalized
    assert SamplingParams(repetition_penalty=1.1).penalized
    assert SamplingParams(presence_penalty=-0.5).penalized
    assert SamplingParams(frequency_penalty=2).penalized


def test_a_temperature_below_the_minimum_is_greedy_and_penalties_stay_in_float32():
    from bulkgen.config import MIN_TEMPERATURE, REPETITION_PENALTY_RANGE

    # 1e-38 made logits / T inf in float32: NaN probabilities, token 0 at every step.
    for t in (1e-40, 1e-38, MIN_TEMPERATURE / 2):
        params = SamplingParams(temperature=t, seed=1)
        assert params.greedy and params.sampling_floats[0] == 0.0
    assert not SamplingParams(temperature=MIN_TEMPERATURE).greedy
    low, high = REPETITION_PENALTY_RANGE
    SamplingParams(repetition_penalty=low), SamplingParams(repetition_penalty=high)
    for r in (1e-300, low / 2, high * 2, True):  # 1e-300 is 0 in float32: a division by zero
        with pytest.raises(ValueError, match="repetition_penalty must be a number in"):
            SamplingParams(repetition_penalty=r)
