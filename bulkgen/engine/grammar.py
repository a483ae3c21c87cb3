"""Grammars for structured output: JSON schemas, regexes and choices, as token masks.

The library is llguidance: one wheel with no torch dependency, it validates a grammar without
a tokenizer (so a bad flag stops a run at preflight, before any model loads), compiles a grammar
against a tokenizer in about a millisecond, copies a compiled matcher in microseconds (the cache
below compiles each distinct grammar once and copies it per request), and writes masks straight
into an int32 bitmask in the layout our samplers read, for a whole batch on its own threads with
the GIL released. Measured with the Llama-3.1 tokenizer and an 8-field schema:
scripts/grammar_bench.py. xgrammar was not adopted: its matchers need a torch-built compiled
grammar per tokenizer and its mask fill is comparable in published benchmarks; llguidance's
single API covers validation, caching and batch fill.

Mask layout: int32 words, bit j of word w allows token 32 * w + j (sampler.unpack_bitmask and
triton_sampler.fused_sample(allowed=...)). A matcher's state always matches the request's
output_ids: it advances in Scheduler.update on every appended token and never sees a token that
is later taken back (recompute after preemption re-runs the prompt and the known output through
the model but never re-samples them), so no rollback is needed.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bulkgen.config import SamplingParams

if TYPE_CHECKING:
    from bulkgen.engine.plan import ScheduledSeq

log = logging.getLogger(__name__)

CACHE_SIZE = 256  # distinct compiled grammars kept (per-row schemas may be many)
# JSON is written as Python's json.dumps writes it ({"a": 1, "b": [2, 3]}): one layout, the one
# models see most, and no free whitespace, which a weak model (or dummy weights) would otherwise
# repeat until max_tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(params: SamplingParams) -> tuple[str, str] | None:
    """(kind, text) naming the request's grammar, or None when unconstrained."""
    if params.json_schema is not None:
        return "json_schema", params.json_schema
    if params.regex is not None:
        return "regex", params.regex
    if params.choice is not None:
        return "choice", json.dumps(list(params.choice))
    return None


def _llguidance_grammar(kind: str, text: str) -> str:
    import llguidance

    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"invalid JSON schema: not JSON ({e})") from None
        if not isinstance(schema, dict | bool):
            raise ValueError(f"invalid JSON schema: must be a JSON object, got {text[:60]!r}")
        return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_LAYOUT)
    return llguidance.grammar_from(kind, text)


def _first_line(message: str) -> str:
    """llguidance's multi-line error in one line: its first line, plus the detail line a regex
    parse error puts below a picture of the pattern."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [message]
    detail = next((line for line in lines[1:] if line.startswith("error:")), None)
    if detail is None:
        return lines[0]
    return f"{lines[0].rstrip(':')}: {detail.removeprefix('error:').strip()}"


_NAMES = {"json_schema": "JSON schema", "regex": "regex", "choice": "choice"}


def check_grammar(params: SamplingParams) -> None:
    """Raise ValueError, one line naming the problem, if params' schema or regex is invalid.

    Needs no tokenizer: the preflight of a run calls it before any model loads.
    """
    named = grammar_text(params)
    if named is None:
        return
    import llguidance

    kind, text = named
    message = llguidance.LLMatcher.validate_grammar(_llguidance_grammar(kind, text))
    if message:
        raise ValueError(f"invalid {_NAMES[kind]}: {_first_line(message)}")


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, ll) -> None:
        self.ll = ll  # an llguidance.LLMatcher
        self.num_consumed = 0  # tokens advanced over: always len(request.output_ids)

    def fill_mask(self, words: np.ndarray) -> None:
        """Write the allowed next tokens into one contiguous int32 row of mask words."""
        assert words.dtype == np.int32 and words.flags["C_CONTIGUOUS"]
        self.ll.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def advance(self, token_id: int) -> bool:
        """Consume a sampled token; False if the grammar rejects it (see `error`)."""
        self.num_consumed += 1
        return self.ll.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        """Take back the last tokens (the engine never needs it; see the module docstring)."""
        self.ll.rollback(num_tokens)
        self.num_consumed -= num_tokens

    @property
    def is_done(self) -> bool:
        """The grammar is complete and nothing but the end token may follow."""
        return self.ll.is_stopped() and not self.ll.is_error()

    @property
    def error(self) -> str | None:
        return self.ll.get_error() or None


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
        import llguidance
        import llguidance.hf

        eos = list(eos_token_ids) or None
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
        self.vocab_size = vocab_size
        self.num_words = -(-vocab_size // 32)
        self._compiled: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._executor = llguidance.LLExecutor()
        self.num_compiled = 0

    def matcher(self, params: SamplingParams) -> Matcher:
        """A fresh matcher for params' grammar; ValueError (one line) if the grammar is bad."""
        import llguidance

        key = grammar_text(params)
        assert key is not None, "matcher() of an unconstrained request"
        proto = self._compiled.get(key)
        if proto is None:
            grammar = _llguidance_grammar(*key)
            proto = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
            if proto.is_error():
                raise ValueError(f"invalid {_NAMES[key[0]]}: {_first_line(proto.get_error())}")
            for warning in proto.get_grammar_warnings():
                log.warning("%s: %s", _NAMES[key[0]], warning)
            self.num_compiled += 1
            self._compiled[key] = proto
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return Matcher(proto.deep_copy())

    def fill_masks(self, sampled: list[ScheduledSeq], words: np.ndarray) -> None:
        """Masks of one step's sampled rows into words [len(sampled), num_words]: all ones for
        unconstrained rows (and rows that finished at the previous step: their token is
        discarded), the grammar's mask for the others, filled in parallel without the GIL."""
        assert words.shape == (len(sampled), self.num_words) and words.flags["C_CONTIGUOUS"]
        words.fill(-1)
        rows = []
        for i, seq in enumerate(sampled):
            req = seq.request
            if req.matcher is not None and not req.is_finished:
                assert req.matcher.num_consumed == len(req.output_ids), "matcher out of step"
                rows.append((req.matcher.ll, i))
        if rows:
            row_bytes = self.num_words * 4
            self._executor.unsafe_compute_mask_ptr(rows, words.ctypes.data, row_bytes, len(words))
