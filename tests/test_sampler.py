"""The sampler's filters and its seeded noise, on hand-made logits."""

from __future__ import annotations

import torch

from bulkgen.engine.sampler import SamplingTensors, apply_filters, sample, uniform_noise


def tensors(b: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, position=0):
    seeds = torch.arange(b) if seed is None else torch.full((b,), seed)
    return SamplingTensors(
        temperature=torch.full((b,), float(temperature)),
        top_k=torch.full((b,), top_k),
        top_p=torch.full((b,), float(top_p)),
        min_p=torch.full((b,), float(min_p)),
        seed=seeds,
        position=torch.full((b,), position),
        all_greedy=temperature == 0,
        any_filter=top_k > 0 or top_p < 1 or min_p > 0,
    )


PROBS = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])


def kept(**kw) -> list[int]:
    out = apply_filters(PROBS.log()[None], tensors(1, **kw))
    return torch.isfinite(out[0]).nonzero().flatten().tolist()


def test_top_k_keeps_the_k_most_likely():
    assert kept(top_k=2) == [0, 1]


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert kept(top_p=0.5) == [0]
    assert kept(top_p=0.7) == [0, 1]
    assert kept(top_p=0.8) == [0, 1, 2]


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    assert kept(min_p=0.2) == [0, 1, 2]  # 0.07 < 0.2 * 0.5


def test_samples_follow_the_distribution():
    n = 20000
    logits = PROBS.log().repeat(n, 1)
    ids = sample(logits, tensors(n))  # one seed per row
    freq = torch.bincount(ids, minlength=5).float() / n
    assert torch.allclose(freq, PROBS, atol=0.015), freq


def test_temperature_sharpens():
    n = 5000
    ids = sample(PROBS.log().repeat(n, 1), tensors(n, temperature=0.3))
    assert (ids == 0).float().mean() > 0.85


def test_noise_depends_only_on_seed_position_and_token():
    a = uniform_noise(torch.tensor([7, 8, 7]), torch.tensor([5, 5, 5]), 64)
    assert torch.equal(a[0], a[2]) and not torch.equal(a[0], a[1])
    b = uniform_noise(torch.tensor([7]), torch.tensor([6]), 64)
    assert not torch.equal(a[0], b[0])
    assert 0.0 < a.min() and a.max() < 1.0


def test_an_allowed_mask_restricts_greedy_and_sampled_tokens():
    n = 2000
    allowed = torch.tensor([False, True, False, True, True]).repeat(n, 1)
    logits = PROBS.log().repeat(n, 1)
    assert sample(logits, tensors(n, temperature=0), allowed).eq(1).all()
    # Renormalised over the allowed tokens: 0.714, 0.2, 0.086; the mass before token 4 is 0.914.
    ids = sample(logits, tensors(n, top_p=0.8), allowed)
    assert set(ids.tolist()) == {1, 3}


def test_noise_is_strictly_below_one_so_no_token_wins_whatever_its_probability():
    # With 24 bits, a token whose hash had its top 24 bits set got u == 1.0 in float32, so
    # -log(u) == 0: it won the race outright (p / 0 = inf) or, filtered or masked, gave NaN,
    # which argmax picks. About 1 token in 2**24, so a few rows of every large-vocabulary step.
    from bulkgen.engine.sampler import uniform_noise

    seeds = torch.arange(400, dtype=torch.int64)
    u = uniform_noise(seeds, torch.zeros_like(seeds), 128256)  # 51M draws: ~3 at 1.0 before
    assert u.max().item() < 1.0 and u.min().item() > 0.0
    assert torch.isfinite(1.0 / -torch.log(u)).all()


def test_a_masked_token_is_never_sampled_even_with_filters():
    vocab, rows = 5000, 64
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    allowed = torch.zeros(rows, vocab, dtype=torch.bool)
    allowed[:, ::97] = True
    st = SamplingTensors(
        temperature=torch.full((rows,), 0.7), top_k=torch.zeros(rows, dtype=torch.int64),
        top_p=torch.full((rows,), 0.95), min_p=torch.zeros(rows),
        seed=torch.arange(rows, dtype=torch.int64), position=torch.arange(rows, dtype=torch.int64),
        all_greedy=False, any_filter=True,
    )  # fmt: skip
    for step in range(20):
        st.position = st.position + 1
        ids = sample(logits, st, allowed)
        assert allowed.gather(1, ids[:, None]).all(), f"step {step}"
