"""Grammar layer of structured output: params, validation without a tokenizer, compile cache."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bulkgen.config import SamplingParams
from bulkgen.engine.grammar import GrammarCompiler, check_grammar

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


def test_choice_list_is_stored_as_a_tuple_and_marks_params_constrained():
    params = SamplingParams(choice=["yes", "no"])
    assert params.choice == ("yes", "no")
    assert params.constrained
    assert not SamplingParams().constrained


@pytest.mark.parametrize(
    "kwargs", [dict(json_schema=SCHEMA, regex="a+"), dict(regex="a", choice=["a"])]
)
def test_at_most_one_constraint(kwargs):
    with pytest.raises(ValueError, match="at most one of json_schema, regex and choice"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("choice", [[], [""], ["a", 3]])
def test_choice_needs_non_empty_strings(choice):
    with pytest.raises(ValueError, match="choice must be a list of non-empty strings"):
        SamplingParams(choice=choice)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(regex="a(b"), "invalid regex: .*parenthesis is not closed"),
        (dict(json_schema='{"type": '), "invalid JSON schema: not JSON"),
        (dict(json_schema='{"type": "objectx"}'), "invalid JSON schema: .*objectx"),
        (dict(json_schema="[1, 2]"), "invalid JSON schema: must be a JSON object"),
    ],
)
def test_check_grammar_names_the_problem_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        check_grammar(SamplingParams(**kwargs))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "kwargs", [dict(json_schema=SCHEMA), dict(regex="[0-9]+"), dict(choice=["x"]), dict()]
)
def test_check_grammar_accepts_valid_grammars(kwargs):
    check_grammar(SamplingParams(**kwargs))


@pytest.fixture(scope="module")
def compiler(tiny_tokenizer):
    return GrammarCompiler(tiny_tokenizer, 384, [tiny_tokenizer.eos_token_id])


def test_one_schema_compiles_once_for_many_requests(compiler):
    before = compiler.num_compiled
    matchers = [compiler.matcher(SamplingParams(json_schema=SCHEMA)) for _ in range(50)]
    assert compiler.num_compiled == before + 1
    assert len({id(m.state) for m in matchers}) == 50  # each request has its own state


def test_matcher_follows_a_choice_to_its_end(compiler, tiny_tokenizer):
    matcher = compiler.matcher(SamplingParams(choice=["Paris", "dog"]))
    ids = tiny_tokenizer.encode("Paris", add_special_tokens=False)
    assert all(matcher.advance(t) for t in ids[:-1]) and not matcher.is_done
    assert matcher.advance(ids[-1]) and matcher.is_done
    matcher.rollback(1)
    assert not matcher.is_done and matcher.num_consumed == len(ids) - 1


def test_mask_allows_only_tokens_the_grammar_accepts(compiler, tiny_tokenizer):
    import numpy as np

    from bulkgen.engine.grammar import Matcher

    matcher = compiler.matcher(SamplingParams(regex="[0-9]{2}"))
    words = np.zeros(compiler.num_words, dtype=np.int32)
    matcher.fill_mask(words)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:384]
    allowed = set(np.flatnonzero(bits).tolist())
    texts = {t: tiny_tokenizer.decode([t]) for t in range(len(tiny_tokenizer))}
    expected = {t for t, s in texts.items() if s and len(s) <= 2 and s.isdigit()}
    assert allowed == expected
    assert isinstance(matcher, Matcher)


def test_invalid_grammar_is_a_value_error_at_compile(compiler):
    with pytest.raises(ValueError, match="invalid regex"):
        compiler.matcher(SamplingParams(regex="(("))


def test_choices_with_regex_metacharacters_match_literally(compiler, tiny_tokenizer):
    choices = ["a.b", "(x)", "c|d", 'q"[1]', "e+f*"]
    for choice in choices:
        matcher = compiler.matcher(SamplingParams(choice=choices))
        ids = tiny_tokenizer.encode(choice, add_special_tokens=False)
        assert all(matcher.advance(t) for t in ids) and matcher.is_done, choice
    matcher = compiler.matcher(SamplingParams(choice=choices))
    assert not all(
        matcher.advance(t) for t in tiny_tokenizer.encode("axb", add_special_tokens=False)
    )


def test_a_json_row_never_allows_a_raw_control_character(compiler, tiny_tokenizer):
    """Inside a string with maxLength xgrammar allows control characters, which JSON forbids."""
    import numpy as np

    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 6}}}
    matcher = compiler.matcher(SamplingParams(json_schema=schema))
    for t in tiny_tokenizer.encode('{"s": "', add_special_tokens=False):
        assert matcher.advance(t)
    words = np.zeros(compiler.num_words, dtype=np.int32)
    matcher.fill_mask(words)
    allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:384])
    pieces = {
        t: tiny_tokenizer.convert_tokens_to_string([tiny_tokenizer.convert_ids_to_tokens(t)])
        for t in allowed.tolist()
    }
    assert len(allowed) > 50  # ordinary characters are allowed
    assert not [t for t, s in pieces.items() if any(ord(c) < 0x20 for c in s)]
    # the batch fill applies the same filter
    request = SimpleNamespace(
        matcher=matcher, output_ids=[0] * matcher.num_consumed, is_finished=False
    )
    batch = np.zeros((1, compiler.num_words), dtype=np.int32)
    compiler.fill_masks([SimpleNamespace(request=request)], batch)
    assert (batch[0] == words).all()
