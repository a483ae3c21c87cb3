"""The fused Triton sampler draws the tokens the torch sampler draws, from the same distribution.

Without CUDA the kernel runs under the Triton interpreter (TRITON_INTERPRET must be set before
triton is imported, hence the order below), on small vocabularies. Vocabulary sizes are not
multiples of 32 or of the kernel's block, so the tail of a row and of its bitmask are covered.
Random logits are continuous, so two race values within float rounding of each other, where the
two samplers could disagree, are vanishingly rare: equality is asserted exactly.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from bulkgen.engine.sampler import (  # noqa: E402
    SamplingTensors,
    sample,
    uniform_noise,
    unpack_bitmask,
)
from bulkgen.engine.triton_sampler import fused_sample, kernel_uniform_noise  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
V = 2007
# The interpreter takes ~10-60 ms a row; on a GPU the distribution tests draw more.
DRAWS = 4000 if torch.cuda.is_available() else 200
# chi-square quantiles at 0.999 by degrees of freedom: a correct sampler fails 1 run in 1000
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def params(b: int, temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed0=0) -> dict:
    """Per-row tensors; a scalar setting is repeated over the rows, a list gives one per row."""

    def col(x, dtype):
        x = x if isinstance(x, list) else [x] * b
        return torch.tensor(x, dtype=dtype, device=DEVICE)

    return dict(
        temperature=col(temperature, torch.float32),
        top_k=col(top_k, torch.int64),
        top_p=col(top_p, torch.float32),
        min_p=col(min_p, torch.float32),
        seed=torch.arange(b, device=DEVICE) * 7919 + seed0,
        position=torch.arange(b, device=DEVICE) * 13 + 5,
    )


def reference(logits: torch.Tensor, p: dict, allowed=None) -> torch.Tensor:
    st = SamplingTensors(**p, all_greedy=False, any_filter=True)
    return sample(logits, st, allowed)


def random_logits(b: int, v: int = V, peaked: bool = False) -> torch.Tensor:
    """Flat (every filter has to search) or peaked like a model's (the race winner is kept)."""
    logits = torch.randn(b, v, device=DEVICE) * 2
    if peaked:
        boost = torch.rand(b, 5, device=DEVICE) * 8 + 6
        logits.scatter_(1, torch.randint(0, v, (b, 5), device=DEVICE), boost)
    return logits


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_kernel_noise_equals_uniform_noise_bit_for_bit():
    seeds = [
        0,
        1,
        2**31 - 1,
        2**31,
        2**32 - 1,
        2**32,
        2**32 + 1,
        2**40 + 3,
        2**63 - 1,
        -1,
        -(2**63),
    ]
    seed = torch.tensor(seeds, device=DEVICE)
    position = torch.tensor(
        [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 5, 7, 2**40, 123456789, 2**62, 3],
        device=DEVICE,
    )
    got = kernel_uniform_noise(seed, position, V)
    want = uniform_noise(seed, position, V)
    assert torch.equal(got, want), (got != want).sum()


SETTINGS = {
    "temperature only": {},
    "temperature 1.3": dict(temperature=1.3),
    "greedy": dict(temperature=0.0, top_p=0.5),
    "top_p 0.95": dict(top_p=0.95),
    "top_p 0.3": dict(top_p=0.3),
    "top_k 1": dict(top_k=1),
    "top_k 50": dict(top_k=50),
    "top_k past the vocabulary": dict(top_k=V + 5),
    "min_p 0.05": dict(min_p=0.05),
    "min_p 0.6": dict(min_p=0.6),
    "top_k 40, top_p 0.6": dict(top_k=40, top_p=0.6),
    "top_k 300, top_p 0.9, min_p 0.02": dict(top_k=300, top_p=0.9, min_p=0.02),
}


@pytest.mark.parametrize("peaked", [False, True], ids=["flat", "peaked"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_ids_equal_the_torch_sampler(name, peaked):
    logits = random_logits(6, peaked=peaked)
    p = params(6, **SETTINGS[name])
    assert torch.equal(fused_sample(logits, **p), reference(logits, p))


def test_a_mixed_batch_samples_each_row_by_its_own_settings():
    b = 10
    p = params(
        b,
        temperature=[0.0, 0.7, 1.0, 0.9, 0.5, 1.2, 0.0, 0.8, 1.0, 0.6],
        top_k=[0, 0, 20, 0, 7, 100, 5, -1, 0, 30],
        top_p=[1.0, 1.0, 1.0, 0.8, 0.9, 0.5, 0.9, 1.0, 0.99, 0.7],
        min_p=[0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.2, 0.0, 0.05],
        seed0=2**40,
    )
    logits = random_logits(b)
    assert torch.equal(fused_sample(logits, **p), reference(logits, p))


def test_greedy_rows_return_the_first_argmax():
    logits = random_logits(4)
    logits[0, [17, 900]] = 50.0  # a tie: torch.argmax returns the first
    p = params(4, temperature=0.0, top_k=[0, 3, 0, 0], top_p=[1.0, 0.5, 1.0, 1.0])
    assert fused_sample(logits, **p).tolist() == [17] + logits[1:].argmax(-1).tolist()


def random_bitmask(b: int, v: int, density: float) -> torch.Tensor:
    allowed = torch.rand(b, v, device=DEVICE) < density
    words = torch.zeros(b, -(-v // 32) * 32, dtype=torch.int64, device=DEVICE)
    words[:, :v] = allowed.long()
    weights = 1 << torch.arange(32, device=DEVICE, dtype=torch.int64)
    packed = (words.view(b, -1, 32) * weights).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).int()  # two's complement


def test_bitmask_round_trips_through_unpack():
    allowed = torch.rand(3, 70, device=DEVICE) < 0.5
    words = torch.zeros(3, 3, dtype=torch.int32, device=DEVICE)
    for b, j in allowed.nonzero().tolist():
        words[b, j // 32] |= torch.tensor(1 << (j % 32)).int().to(DEVICE)
    assert torch.equal(unpack_bitmask(words, 70), allowed)


@pytest.mark.parametrize("name", ["temperature only", "greedy", "top_p 0.3", "top_k 50"])
def test_bitmask_restricts_the_distribution_before_the_filters(name):
    b = 8
    words = random_bitmask(b, V, density=0.1)
    allowed = unpack_bitmask(words, V)
    logits = random_logits(b)
    logits[allowed.logical_not()] += 10.0  # the unconstrained winner is always disallowed
    p = params(b, **SETTINGS[name])
    ids = fused_sample(logits, **p, allowed=words)
    assert allowed.gather(1, ids[:, None]).all()
    assert torch.equal(ids, reference(logits, p, allowed))


def test_a_full_bitmask_changes_nothing():
    logits = random_logits(4)
    p = params(4, top_p=0.8)
    words = torch.full((4, -(-V // 32)), -1, dtype=torch.int32, device=DEVICE)
    assert torch.equal(fused_sample(logits, **p, allowed=words), fused_sample(logits, **p))


PROBS = torch.tensor([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.03, 0.02])


@pytest.mark.parametrize(
    "setting, kept",
    [
        ({}, 8),
        ({"top_p": 0.7}, 4),  # mass before each: 0, .3, .5, .65 < .7; .77 is not
        ({"top_k": 3}, 3),
        ({"min_p": 0.3}, 5),  # p >= 0.09
        ({"top_k": 6, "top_p": 0.6}, 3),  # renormalised over 0.95: .316, .211, .158 ...
    ],
)
def test_samples_follow_the_filtered_distribution(setting, kept):
    n = DRAWS  # 200 draws tell sampling by p from sampling by p**2 (chi-square 37 against 24)
    logits = PROBS.log().to(DEVICE).repeat(n, 1)
    ids = fused_sample(logits, **params(n, temperature=1.0, **setting))
    counts = torch.bincount(ids.cpu(), minlength=8).double()
    assert counts[kept:].sum() == 0, counts
    expected = PROBS[:kept].double() / PROBS[:kept].sum() * n
    chi2 = ((counts[:kept] - expected) ** 2 / expected).sum().item()
    assert chi2 < CHI2_999.get(kept - 1, 0.0), (chi2, counts)


def test_top_k_keeps_every_token_tied_with_the_kth():
    n = 100  # at T = 2 each tied token has probability 0.14: all three show up
    logits = torch.tensor([5.0, 4.0, 3.0, 3.0, 3.0, 0.0, -1.0, -2.0], device=DEVICE).repeat(n, 1)
    ids = fused_sample(logits, **params(n, temperature=2.0, top_k=3))
    assert set(ids.tolist()) == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("setting", [{"top_k": 1}, {"top_k": 3}, {"top_p": 0.002}])
def test_rows_that_reject_many_race_winners_still_draw_the_reference_ids(setting):
    # Near-equal logits: the race winner over all 2007 tokens is almost never among the top
    # three, and each rejection round only halves the rank on average (~7 rounds a row).
    logits = torch.randn(8, V, device=DEVICE) * 0.01
    p = params(8, temperature=1.0, **setting)
    ids = fused_sample(logits, **p)
    assert torch.equal(ids, reference(logits, p))
    if setting == {"top_k": 1}:
        assert torch.equal(ids, logits.argmax(dim=-1))
