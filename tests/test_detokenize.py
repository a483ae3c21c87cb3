"""Detokenize: the same text as transformers' batch_decode, from the Rust decoder where it can.

Whether batch_decode cleans up spaces (" ." -> ".") depends on the transformers version and the
tokenizer's model (5.24 skips it for BPE, keeps it for others), so each case here is compared
with the installed batch_decode, the oracle, never with a fixed string.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from bulkgen.text.stage import Detokenize

TEXTS = [
    "Paris is nice . Is it ? Yes ! a , b",
    "we do n't know , I 'm sure it 's fine ; we 've seen they 're here",
    "quote ' here ' and don't stop .",
]
SPECIALS = ["<unk>", "<s>", "</s>"]


def _wrap(tok: Tokenizer, clean_up: bool, cls=PreTrainedTokenizerFast):
    return cls(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=clean_up,
    )


def bpe(clean_up: bool, cls=PreTrainedTokenizerFast):
    """A byte-level BPE (as Llama 3's): transformers 5.24 skips its clean-up, older ones not."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 4, trainer)
    return _wrap(tok, clean_up, cls)


def word_level(clean_up: bool):
    """Words joined by spaces on decode: the clean-up, where asked for, is applied to it."""
    words = sorted(
        {w for text in TEXTS for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text)}
    )
    vocab = {t: i for i, t in enumerate(SPECIALS + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return _wrap(tok, clean_up)


def bpe_cleaned(clean_up: bool):
    """A BPE whose clean-up 5.24 applies too, as older versions do for every tokenizer."""
    tokenizer = bpe(clean_up)
    tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    return tokenizer


BUILDERS = {"bpe": bpe, "bpe_cleaned": bpe_cleaned, "word_level": word_level}


def rows_of_ids(tokenizer) -> list[list[int]]:
    """TEXTS with special tokens around and inside, so that skip_special matters."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    return [[bos, *row, eos] for row in ids] + [ids[0] + [eos] + ids[1], []]


@pytest.mark.parametrize("skip_special", [True, False])
@pytest.mark.parametrize("clean_up", [True, False])
@pytest.mark.parametrize("model", BUILDERS)
def test_decode_equals_batch_decode(model, clean_up, skip_special):
    tokenizer = BUILDERS[model](clean_up)
    ids = rows_of_ids(tokenizer)
    expected = tokenizer.batch_decode(ids, skip_special_tokens=skip_special)
    assert Detokenize(tokenizer).decode(ids, skip_special) == expected


def test_the_cases_differ_so_the_comparison_means_something():
    """The word-level tokenizer's batch_decode does clean up, and the rows hold what it changes."""
    ids = rows_of_ids(word_level(True))
    cleaned = word_level(True).batch_decode(ids, skip_special_tokens=True)
    raw = word_level(False).batch_decode(ids, skip_special_tokens=True)
    assert cleaned != raw and "nice. Is it?" in cleaned[0] and "nice . Is it ?" in raw[0]


@pytest.mark.parametrize("clean_up", [True, False])
@pytest.mark.parametrize("model", BUILDERS)
def test_fast_tokenizers_decode_without_batch_decode(model, clean_up, monkeypatch):
    """The Rust decoder (which releases the GIL) does the work, with or without the clean-up."""
    tokenizer = BUILDERS[model](clean_up)
    ids = rows_of_ids(tokenizer)
    expected = {s: tokenizer.batch_decode(ids, skip_special_tokens=s) for s in (True, False)}
    detokenize = Detokenize(tokenizer)

    def refuse(*args, **kwargs):
        raise AssertionError("batch_decode called on the fast path")

    monkeypatch.setattr(tokenizer, "batch_decode", refuse)
    monkeypatch.setattr(tokenizer, "decode", refuse)
    assert {s: detokenize.decode(ids, s) for s in (True, False)} == expected


class Shouting(PreTrainedTokenizerFast):
    """A tokenizer whose decode does what neither the Rust decoder nor the clean-up explains."""

    def _decode(self, *args, **kwargs) -> str:
        return super()._decode(*args, **kwargs).upper() + "!"


@pytest.mark.parametrize("clean_up", [True, False])
def test_a_decode_the_probe_cannot_explain_stays_on_batch_decode(clean_up, monkeypatch):
    tokenizer = bpe(clean_up, Shouting)
    ids = rows_of_ids(tokenizer)
    detokenize = Detokenize(tokenizer)
    calls = []
    batch_decode = tokenizer.batch_decode
    monkeypatch.setattr(
        tokenizer, "batch_decode", lambda *a, **k: calls.append(a) or batch_decode(*a, **k)
    )
    texts = detokenize.decode(ids, True)
    assert calls and texts == batch_decode(ids, skip_special_tokens=True)
    assert texts[0].endswith("!") and "PARIS" in texts[0]


def test_a_tokenizer_the_probe_cannot_run_on_keeps_batch_decode(monkeypatch):
    tokenizer = bpe(False)
    ids = rows_of_ids(tokenizer)

    def refuse(*args, **kwargs):
        raise RuntimeError("this tokenizer encodes nothing")

    monkeypatch.setattr(tokenizer, "encode", refuse)  # the probe's first call fails
    detokenize = Detokenize(tokenizer)  # no error: the fast path is only an optimisation
    assert detokenize._backend is None
    assert detokenize.decode(ids, True) == tokenizer.batch_decode(ids, skip_special_tokens=True)
