"""Grammars for structured output: JSON schemas, regexes and choices, as token masks.

The library is xgrammar (the default of vLLM and SGLang). Both maintained libraries were measured
on our workload before choosing (scripts/grammar_bench.py: the Llama-3.1 tokenizer, an 8-field
JSON schema, 256 rows walking it at random as dummy weights do, this repo's 2-core CPU): xgrammar
fills a step's masks in 1.4-1.5 ms (5-6 us per row; p99 of one row 70-75 us), llguidance in
17-19 ms (68-75 us per row; p99 1.3-1.8 ms) -- a 12x difference in the one cost that sits on
every constrained step, against a one-off compile of 45 ms versus 2 ms per distinct grammar.
xgrammar also validates a grammar without a tokenizer (so a bad flag stops a run at preflight,
before any model loads) and fills a batch of masks on its own threads with the GIL released.

Mask layout: int32 words, bit j of word w allows token 32 * w + j (sampler.unpack_bitmask and
triton_sampler.fused_sample(allowed=...)); xgrammar's bitmask is that layout. A matcher's state
always matches the request's output_ids: it advances in Scheduler.update on every appended token
and never sees a token that is later taken back (recompute after preemption re-runs the prompt
and the known output through the model but never re-samples them), so no rollback is needed.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bulkgen.config import SamplingParams
from bulkgen.engine.schema_support import check_schema

if TYPE_CHECKING:
    from bulkgen.engine.plan import ScheduledSeq

log = logging.getLogger(__name__)

CACHE_SIZE = 256  # distinct compiled grammars kept (per-row schemas may be many)
# JSON is written as Python's json.dumps writes it ({"a": 1, "b": [2, 3]}): one layout, the one
# models see most, and no free whitespace, which a weak model (or dummy weights) would otherwise
# repeat until max_tokens.
JSON_LAYOUT = {"any_whitespace": False, "separators": (", ", ": "), "strict_mode": False}
# strict_mode=False keeps JSON Schema's meaning: an object without "additionalProperties": false
# may have other keys ({"type": "object"} is any object, what --json asks for).
_REGEX_SPECIALS = set("\\^$.|?*+()[]{}/-")


def grammar_text(params: SamplingParams) -> tuple[str, str] | None:
    """(kind, text) naming the request's grammar, or None when unconstrained."""
    if params.json_schema is not None:
        return "json_schema", params.json_schema
    if params.regex is not None:
        return "regex", params.regex
    if params.choice is not None:
        return "choice", json.dumps(list(params.choice))
    return None


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of the strings (every regex metacharacter escaped)."""
    escape = "".join
    return "|".join(
        "(" + escape("\\" + c if c in _REGEX_SPECIALS else c for c in choice) + ")"
        for choice in choices
    )


def _grammar(kind: str, text: str):
    """The xgrammar Grammar of (kind, text): no tokenizer needed; ValueError if it is bad or a
    schema the grammar cannot enforce (schema_support.py; a schema is already a JSON object's
    compact text: SamplingParams checked that)."""
    import xgrammar as xgr

    if kind == "json_schema":
        check_schema(json.loads(text))  # its own ValueError, one line
    try:
        if kind == "json_schema":
            return xgr.Grammar.from_json_schema(text, **JSON_LAYOUT)
        pattern = text if kind == "regex" else choice_regex(json.loads(text))
        return xgr.Grammar.from_regex(pattern)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"invalid {_NAMES[kind]}: {_first_line(str(e))}") from None


def _first_line(message: str) -> str:
    """xgrammar's error in one line, without the C++ source location it starts with
    ('[00:01:46] /project/cpp/regex_converter.cc:94: Regex parsing error ...')."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [message]
    return re.sub(r"^\[[\d:.]+\] \S+:\d+: ", "", lines[0])


_NAMES = {"json_schema": "JSON schema", "regex": "regex", "choice": "choice"}


def check_grammar(params: SamplingParams) -> None:
    """Raise ValueError, one line naming the problem, if params' schema or regex is invalid.

    Needs no tokenizer: the preflight of a run calls it before any model loads.
    """
    named = grammar_text(params)
    if named is not None:
        _grammar(*named)


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, state, stop_words: np.ndarray, json_words: np.ndarray | None) -> None:
        self.state = state  # an xgrammar.GrammarMatcher
        self.num_consumed = 0  # tokens advanced over: always len(request.output_ids)
        self._stop_words = stop_words  # mask words with only the end tokens' bits set
        self.json_words = json_words  # for JSON grammars: tokens without control characters
        self._done_at: tuple[int, bool] | None = None  # (num_consumed, is_done) last computed

    def fill_mask(self, words: np.ndarray) -> None:
        """Write the allowed next tokens into one contiguous int32 row of mask words."""
        assert words.dtype == np.int32 and words.flags["C_CONTIGUOUS"]
        self.state.fill_next_token_bitmask(words.reshape(1, -1), 0)
        if self.json_words is not None:
            words &= self.json_words

    def advance(self, token_id: int) -> bool:
        """Consume a sampled token; False if the grammar rejects it (see `error`)."""
        self.num_consumed += 1
        return self.state.accept_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        """Take back the last tokens (the engine never needs it; see the module docstring)."""
        self.state.rollback(num_tokens)
        self.num_consumed -= num_tokens

    @property
    def is_done(self) -> bool:
        """The grammar is complete and nothing but an end token may follow (a regex like
        [a-z]+ is complete after one letter but may go on: the model's end token ends it)."""
        if self.state.is_terminated():
            return True
        if not self.state.is_completed():
            return False
        if self._done_at is None or self._done_at[0] != self.num_consumed:
            words = np.empty_like(self._stop_words)
            self.fill_mask(words)
            self._done_at = (self.num_consumed, not np.any(words & ~self._stop_words))
        return self._done_at[1]

    @property
    def error(self) -> str | None:
        """Why the token advance() refused was refused (its state is the one before it): where
        the mask allowed nothing, the constraint's fault, not the engine's (read here, on this
        rare path, not at every step's masks)."""
        words = np.empty_like(self._stop_words)
        self.fill_mask(words)
        if not words.any():
            return (
                "the constraint allows no token here (a pattern that needs a raw control "
                "character, which JSON text cannot hold, or a regex that no text matches)"
            )
        return "the grammar does not allow it here"


def load_tokenizer(model_dir: Path | None):
    """The model folder's Hugging Face tokenizer (only the grammar needs it in the engine)."""
    if model_dir is None:
        raise ValueError("constrained output needs a tokenizer: set engine.tokenizer")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


class GrammarCompiler:
    """Compiles grammars against one tokenizer, once per distinct (kind, text); fills masks."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]) -> None:
        """tokenizer: a fast Hugging Face tokenizer; vocab_size: the model's (mask width);
        eos_token_ids: the engine's end tokens, the only ones a complete grammar allows."""
        import xgrammar as xgr

        eos = list(eos_token_ids) or None
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=eos
        )
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)  # our LRU below
        self._batch = xgr.BatchGrammarMatcher()
        self.vocab_size = vocab_size
        self.num_words = -(-vocab_size // 32)
        self._stop_words = np.zeros(self.num_words, dtype=np.int32)
        for t in info.stop_token_ids:
            self._stop_words.view(np.uint32)[t // 32] |= np.uint32(1 << (t % 32))
        self._json_words = _json_words(info, self.num_words)
        self._compiled: OrderedDict[tuple[str, str], object] = OrderedDict()
        self.num_compiled = 0

    def matcher(self, params: SamplingParams) -> Matcher:
        """A fresh matcher for params' grammar; ValueError (one line) if the grammar is bad."""
        import xgrammar as xgr

        key = grammar_text(params)
        assert key is not None, "matcher() of an unconstrained request"
        compiled = self._compiled.get(key)
        if compiled is None:
            grammar = _grammar(*key)
            try:  # xgrammar finds some bad grammars only now (a RuntimeError)
                compiled = self._compiler.compile_grammar(grammar)
            except (RuntimeError, ValueError) as e:
                raise ValueError(f"invalid {_NAMES[key[0]]}: {_first_line(str(e))}") from None
            self.num_compiled += 1
            self._compiled[key] = compiled
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        json_words = self._json_words if key[0] == "json_schema" else None
        return Matcher(xgr.GrammarMatcher(compiled), self._stop_words, json_words)

    def fill_masks(self, sampled: list[ScheduledSeq], words: np.ndarray) -> None:
        """Masks of one step's sampled rows into words [len(sampled), num_words]: all ones for
        unconstrained rows (and rows that finished at the previous step: their token is
        discarded), the grammar's mask for the others, filled in parallel without the GIL."""
        assert words.shape == (len(sampled), self.num_words) and words.flags["C_CONTIGUOUS"]
        words.fill(-1)
        states, rows, json_rows = [], [], []
        for i, seq in enumerate(sampled):
            req = seq.request
            if req.matcher is not None and not req.is_finished:
                assert req.matcher.num_consumed == len(req.output_ids), "matcher out of step"
                states.append(req.matcher.state)
                rows.append(i)
                if req.matcher.json_words is not None:
                    json_rows.append(i)
        if states:
            self._batch.batch_fill_next_token_bitmask(states, words, rows)
        if len(json_rows) == len(words):
            words &= self._json_words  # in place, broadcast: the common all-JSON batch
        else:
            for i in json_rows:
                words[i] &= self._json_words


def _json_words(info, num_words: int) -> np.ndarray:
    """Mask words allowing every token but those with a control character (bytes 0-31).

    JSON text never holds a raw control character in our layout (no free whitespace; inside a
    string it must be escaped), yet xgrammar 0.2's rule for a string with maxLength allows any
    character but quote, backslash, CR and LF (seen: a form feed inside a "name" made the row
    fail json.loads). ANDed into every JSON row's mask. It dead-ends a row only where the schema
    itself asks for a raw control character (a "pattern" of "\\n"), which JSON text cannot hold:
    that row's error record says so (Matcher.error).
    """
    bits = np.ones(num_words * 32, dtype=np.uint8)
    for token, piece in enumerate(info.decoded_vocab):
        if any(b < 0x20 for b in piece):
            bits[token] = 0
    bits[list(info.stop_token_ids)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)
