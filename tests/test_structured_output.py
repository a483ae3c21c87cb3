"""Structured output in the engine: constrained rows obey their grammar, the rest is unchanged."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from bulkgen.config import SamplingParams
from bulkgen.llm import LLM

PROMPTS = ["The quick brown fox", "Write a haiku about", "Numbers: 0 1 2", "What is the capital"]
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "pos": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "boolean"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "pos"],
        "additionalProperties": False,
    },
    "array_enum_range": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "minItems": 1, "maxItems": 3},
            "n": {"type": "integer", "minimum": 3, "maximum": 42},
        },
        "required": ["tags", "n"],
        "additionalProperties": False,
    },
    "pattern_anyof": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^[a-f]{2}[0-9]$"},
            "v": {"anyOf": [{"type": "integer"}, {"type": "null"}, {"enum": ["none"]}]},
        },
        "required": ["id", "v"],
        "additionalProperties": False,
    },
}
REGEX = r"[0-9]{3}-[a-z]{2,4}( ok)?"


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), device="cpu")


def _sampled(max_tokens=48, **constraint) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, **constraint)
        for i in range(len(PROMPTS))
    ]


def _assert_tokens_obey(llm, out, params):
    """Replaying the output through a fresh matcher accepts every sampled token."""
    matcher = llm.engine.grammars.matcher(params)
    assert all(matcher.advance(t) for t in out.token_ids), (out.text, matcher.error)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_rows_that_stop_validate_against_their_schema(llm, name):
    params = _sampled(json_schema=json.dumps(SCHEMAS[name]))
    outs = llm.generate(PROMPTS, params)
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert stopped, [o.text for o in outs]
    for out in stopped:
        jsonschema.validate(json.loads(out.text), SCHEMAS[name])
    for out, p in zip(outs, params, strict=True):
        _assert_tokens_obey(llm, out, p)


def test_regex_rows_that_stop_match_it_fully(llm):
    params = _sampled(regex=REGEX)
    outs = llm.generate(PROMPTS, params)
    assert any(o.finish_reason == "stop" for o in outs)
    for out, p in zip(outs, params, strict=True):
        if out.finish_reason == "stop":
            assert re.fullmatch(REGEX, out.text), out.text
        _assert_tokens_obey(llm, out, p)


def test_choice_rows_are_exactly_one_choice(llm):
    choices = ("Paris", "the lazy dog", "0 1 2 3")
    outs = llm.generate(PROMPTS, _sampled(choice=choices))
    assert [o.finish_reason for o in outs] == ["stop"] * len(PROMPTS)
    assert all(o.text in choices for o in outs)


def test_greedy_constrained_equals_greedy_when_the_model_already_obeys(llm, tiny_tokenizer):
    prompts = PROMPTS + ["A paged KV cache", "Bonjour, comment", "def add(a, b):", "Summarise"]
    free = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    cases = 0
    for prompt, out in zip(prompts, free, strict=True):
        # The longest prefix that is whole UTF-8 text (a choice is a string, not bytes).
        k = max(k for k in range(13) if "\ufffd" not in tiny_tokenizer.decode(out.token_ids[:k]))
        if k < 2:
            continue
        text = tiny_tokenizer.decode(out.token_ids[:k])
        params = SamplingParams(max_tokens=20, temperature=0.0, choice=[text, "zz" + text])
        (forced,) = llm.generate([prompt], params)
        assert forced.token_ids == out.token_ids[:k] and forced.finish_reason == "stop"
        cases += 1
    assert cases >= 2


def test_a_row_cut_by_max_tokens_ends_with_length_and_a_valid_prefix(llm):
    params = SamplingParams(
        max_tokens=5, temperature=0.0, json_schema=json.dumps(SCHEMAS["nested"])
    )
    (out,) = llm.generate(PROMPTS[:1], params)
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert '{"name": "'.startswith(out.text)  # a prefix of the only way to begin
    _assert_tokens_obey(llm, out, params)


def test_plain_rows_in_a_mixed_batch_are_unchanged(llm):
    plain = [SamplingParams(max_tokens=16, temperature=1.0, seed=7 + i) for i in range(2)]
    constrained = _sampled(max_tokens=16, regex=REGEX)[:2]
    alone_plain = llm.generate(PROMPTS[:2], plain)
    alone_constrained = llm.generate(PROMPTS[2:], constrained)
    mixed = llm.generate(PROMPTS, plain + constrained)
    assert [o.token_ids for o in mixed[:2]] == [o.token_ids for o in alone_plain]
    assert [o.token_ids for o in mixed[2:]] == [o.token_ids for o in alone_constrained]


def test_async_and_sync_loops_agree(tiny_model_dir, llm):
    params = _sampled(json_schema=json.dumps(SCHEMAS["array_enum_range"]))
    sync = LLM(str(tiny_model_dir), device="cpu", async_loop=False)
    assert [o.token_ids for o in sync.generate(PROMPTS, params)] == [
        o.token_ids for o in llm.generate(PROMPTS, params)
    ]


def test_preemption_by_a_tiny_cache_gives_the_same_constrained_outputs(tiny_model_dir, llm):
    params = _sampled(max_tokens=40, json_schema=json.dumps(SCHEMAS["nested"]))
    tiny = LLM(str(tiny_model_dir), device="cpu", block_size=4, num_blocks=14, prefix_cache=False,
               output_reserve=0.0)  # fmt: skip
    outs = tiny.generate(PROMPTS, params)
    assert tiny.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_logprobs_are_those_of_the_unconstrained_model(llm):
    k = 384  # the whole vocabulary: the first position's full distribution
    (free,) = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=1, logprobs=k))
    full = dict(free.top_logprobs[0])
    params = SamplingParams(max_tokens=3, temperature=0.0, logprobs=0, regex="[0-9]+")
    (forced,) = llm.generate(PROMPTS[:1], params)
    assert forced.logprobs[0] == pytest.approx(full[forced.token_ids[0]], abs=1e-5)
    assert forced.logprobs[0] < max(full.values())  # the model's favourite is not a digit


def test_an_invalid_grammar_fails_its_row_alone(llm):
    params = [SamplingParams(max_tokens=4, regex="(("), SamplingParams(max_tokens=4)]
    bad, good = llm.generate(PROMPTS[:2], params)
    assert bad.finish_reason == "error" and "invalid regex" in bad.error
    assert good.finish_reason == "length" and len(good.token_ids) == 4
    # A schema xgrammar itself would accept and then fail to compile (a RuntimeError that
    # stopped the whole job), and one it would not enforce: each its own row's error.
    negative = {"type": "object", "properties": {"a": {"type": "string", "minLength": -1}}}
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    params = [SamplingParams(max_tokens=4, json_schema=negative)]
    params += [SamplingParams(max_tokens=4, json_schema=unique), SamplingParams(max_tokens=4)]
    negative_out, unique_out, good = llm.generate(PROMPTS[:3], params)
    assert negative_out.finish_reason == "error" and "minimum of 0" in negative_out.error
    assert unique_out.finish_reason == "error" and "'uniqueItems'" in unique_out.error
    assert good.finish_reason == "length" and len(good.token_ids) == 4


@pytest.mark.parametrize(
    "constraint",
    [{"json_schema": {"type": "string", "pattern": "^\\t$"}}, {"regex": "[^\\s\\S]"}],
    ids=["pattern-needs-a-tab", "regex-matches-nothing"],
)
def test_a_constraint_that_allows_no_token_says_so(llm, constraint):
    """A JSON pattern needing a raw tab (JSON text cannot hold one) or a regex no text matches:
    the mask allows nothing, and the row's error says the constraint allows no token here (it
    said "the grammar does not allow it here", the words kept for an engine bug)."""
    (out,) = llm.generate(["Hi"], SamplingParams(max_tokens=8, seed=1, **constraint))
    assert out.finish_reason == "error" and "allows no token here" in out.error
    (ok,) = llm.generate(["Hi"], SamplingParams(max_tokens=8, seed=1, regex="[a-z]+"))
    assert ok.finish_reason != "error"
