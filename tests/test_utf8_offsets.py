"""Completions text_offset (io/openai.py): each token's offset is the index of the character
its first byte belongs to in the text as decoded (text/utf8_offsets.py), special tokens add no
character, and each position's top_logprobs hold the sampled token (OpenAI: "up to
logprobs+1 elements")."""

from __future__ import annotations

import random

from test_token_bytes import choice

from bulkgen.engine.token_logprobs import TokenLogprobs
from bulkgen.row import Row
from bulkgen.text.stage import Detokenize
from bulkgen.text.utf8_offsets import character_starts, token_offsets

PIECES = [b"\xe4", b"\xbd", b"\xa0", b"a", b"\xf0", b"\x9f", b"\x98", b"\x80", b"\xed"]
PIECES += [b"\xc3", b"\xe0", b"\xff", b"\xc0", b"\xf4", b"\x90", b"\x8f", b"\xe2\x82"]


def test_character_starts_follow_pythons_replacement_decoding():
    rng = random.Random(0)
    for _ in range(5000):
        data = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        starts = character_starts(data)
        text = data.decode("utf-8", "replace")
        assert len(starts) == len(text), data
        spans = zip(starts, [*starts[1:], len(data)][: len(starts)], strict=True)
        assert [data[a:b].decode("utf-8", "replace") for a, b in spans] == list(text), data


def test_a_dangling_lead_byte_is_a_character_and_the_next_token_follows_it():
    assert token_offsets([b"\xe4", b"6"], 19) == [19, 20]  # "\ufffd6": 6 is character 20
    assert token_offsets([b"\xc3", b"\xbc", b"\xe2", b"\x82", b"\xac"], 2) == [2, 2, 3, 3, 3]
    assert token_offsets([b"a", b"", b"b", b""], 0) == [0, 1, 1, 2]  # no bytes: where the next is


def test_special_tokens_add_no_character_and_the_sampled_token_is_in_its_top(tiny_tokenizer):
    tokenizer = tiny_tokenizer
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    words = tokenizer.encode(" hello", add_special_tokens=False)
    ids = [*words, bos, *words]
    row = Row(id="a", prompt="p", prompt_text="xy", token_ids=ids, api="text")
    row.finish_reason = "length"
    others = [i + 1 if i + 1 != bos else i + 2 for i in ids]  # never the sampled token
    pairs = [[(o, -0.25)] for o in others]
    row.token_logprobs = TokenLogprobs.from_pairs([-0.5] * len(ids), pairs, 1)
    Detokenize(tokenizer)([row])
    assert row.text == tokenizer.decode(ids, skip_special_tokens=True)
    logprobs = choice(row, tokenizer)["logprobs"]
    shown = len(tokenizer.decode(words))
    offsets = logprobs["text_offset"]
    assert offsets[len(words)] == offsets[len(words) + 1] == 2 + shown  # the special token's
    text = "xy" + row.text
    for token, at in zip(
        logprobs["tokens"][len(words) + 1 :], offsets[len(words) + 1 :], strict=True
    ):
        assert text[at:].startswith(token)
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert top[token] == logprob and len(top) == 2  # the one alternative, then the sampled
