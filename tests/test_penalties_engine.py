"""Penalties in the engine: per-row token counts on the device, against transformers and a plain
reference loop, through preemption and beside unpenalised rows."""

from __future__ import annotations

import torch
from test_engine import PROMPTS, encode_all

from bulkgen import LLM, SamplingParams


def hf_generate(model_dir, prompts: list[list[int]], n: int, **kw) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for ids in prompts:
        y = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, **kw)
        outs.append(y[0, len(ids) :].tolist())
    return outs


def reference_greedy(model_dir, prompts, n: int, presence: float, frequency: float):
    """Greedy decoding with OpenAI's presence/frequency penalties, one token at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for ids in prompts:
        out: list[int] = []
        for _ in range(n):
            with torch.no_grad():
                logits = model(torch.tensor([ids + out])).logits[0, -1]
            counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=len(logits))
            logits = logits - presence * (counts > 0).float() - frequency * counts.float()
            out.append(int(logits.argmax()))
        outs.append(out)
    return outs


def test_repetition_penalty_matches_transformers_generate(tiny_model_dir):
    ids = encode_all(tiny_model_dir, PROMPTS)
    params = SamplingParams(max_tokens=20, temperature=0.0, repetition_penalty=1.5)
    outs = LLM(str(tiny_model_dir), dtype="float32", device="cpu").generate(ids, params)
    expected = hf_generate(tiny_model_dir, ids, 20, repetition_penalty=1.5)
    assert [o.token_ids for o in outs] == expected
    plain = hf_generate(tiny_model_dir, ids, 20)
    assert expected != plain, "the penalty must change some outputs for the test to mean much"


def test_presence_and_frequency_penalties_match_a_reference_loop(tiny_model_dir):
    ids = encode_all(tiny_model_dir, PROMPTS[:5])
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True,
                            presence_penalty=0.8, frequency_penalty=0.6)  # fmt: skip
    outs = LLM(str(tiny_model_dir), dtype="float32", device="cpu").generate(ids, params)
    expected = reference_greedy(tiny_model_dir, ids, 16, presence=0.8, frequency=0.6)
    assert [o.token_ids for o in outs] == expected


def test_penalties_survive_preemption_and_leave_other_rows_alone(tiny_model_dir):
    ids = encode_all(tiny_model_dir, PROMPTS)
    penalised = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                               repetition_penalty=1.4, frequency_penalty=0.5)  # fmt: skip
    plain = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    mixed = [penalised if i % 2 else plain for i in range(len(ids))]
    roomy = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    tight = LLM(str(tiny_model_dir), dtype="float32", device="cpu", block_size=16, num_blocks=12,
                max_batch_tokens=32, max_num_seqs=8, output_reserve=0.0)  # fmt: skip
    want = [o.token_ids for o in roomy.generate(ids, mixed)]
    got = [o.token_ids for o in tight.generate(ids, mixed)]
    assert tight.engine.scheduler.num_preemptions > 0
    assert got == want
    alone = [o.token_ids for o in roomy.generate(ids, plain)]
    assert [w for i, w in enumerate(want) if i % 2 == 0] == alone[::2]
    assert [w for i, w in enumerate(want) if i % 2] != alone[1::2]
