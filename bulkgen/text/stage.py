"""The text stages around the engine: prompts to token ids before it, token ids to text after.

Both work on whole batches through the Rust tokenizer, which releases the GIL while it works, so
they run beside the other stages instead of taking turns with them.
"""

from __future__ import annotations

from bulkgen.row import Row
from bulkgen.text.encoder import PromptEncoder
from bulkgen.text.template import ChatTemplate


def _backend(tokenizer):
    """The Rust tokenizer behind a transformers fast tokenizer, or None for a slow one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    # Transformers' own clean-up pass is not in the Rust decoder: keep it where it is asked for.
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    return backend


class Tokenize:
    """Fills each row's prompt_ids, or marks the row as an error saying what is wrong with it."""

    def __init__(self, tokenizer, chat_template: bool, vocab_size: int) -> None:
        template = ChatTemplate(tokenizer) if chat_template else None
        self.encode = PromptEncoder(tokenizer, template).encode
        self.vocab_size = vocab_size

    def __call__(self, rows: list[Row]) -> None:
        texts: list[str] = []
        text_rows: list[Row] = []
        for row in rows:
            if row.error is not None:
                continue
            prompt = row.prompt
            if isinstance(prompt, str):
                row.prompt_text = prompt
                if prompt:
                    texts.append(prompt)
                    text_rows.append(row)
                else:
                    row.fail("prompt is empty")
            elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                self._check_ids(row, prompt)
            else:
                row.fail(_problem(prompt))
        if texts:
            for row, ids in zip(text_rows, self.encode(texts), strict=True):
                if ids:
                    row.prompt_ids = ids
                else:  # e.g. only whitespace, which some tokenizers drop
                    row.fail("prompt has no tokens")

    def _check_ids(self, row: Row, ids: list[int]) -> None:
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            row.fail(f"prompt token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        else:
            row.prompt_ids = ids


def _problem(prompt: object) -> str:
    if prompt is None:
        return "prompt is null"
    if isinstance(prompt, list):
        if not prompt:
            return "prompt is an empty list"
        return "prompt is a list but not of token ids (integers)"
    shown = repr(prompt)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"prompt is {type(prompt).__name__} {shown}, not a string or a list of token ids"


class Detokenize:
    """Fills each generated row's text (and the prompt text of pre-tokenized rows)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._backend = _backend(tokenizer)

    def __call__(self, rows: list[Row]) -> None:
        done = [r for r in rows if r.token_ids is not None]
        for row, text in zip(done, self.decode([r.token_ids for r in done]), strict=True):
            row.text = text
        pretokenized = [r for r in rows if r.prompt_text is None and r.prompt_ids is not None]
        if pretokenized:
            texts = self.decode([r.prompt_ids for r in pretokenized], skip_special=False)
            for row, text in zip(pretokenized, texts, strict=True):
                row.prompt_text = text

    def decode(self, ids: list[list[int]], skip_special: bool = True) -> list[str]:
        if not ids:
            return []
        if self._backend is None:
            return self._tokenizer.batch_decode(ids, skip_special_tokens=skip_special)
        return self._backend.decode_batch(ids, skip_special_tokens=skip_special)
