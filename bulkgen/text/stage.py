"""The text stages around the engine: prompts to token ids before it, token ids to text after.

Both work on whole batches through the Rust tokenizer, which releases the GIL while it works, so
they run beside the other stages instead of taking turns with them.
"""

from __future__ import annotations

from collections.abc import Callable

from bulkgen.row import Row
from bulkgen.text.chat import Conversations, checked_messages
from bulkgen.text.encoder import PromptEncoder
from bulkgen.text.stop import cut_at_stop, keep_first_tokens, kept_token_counts
from bulkgen.text.template import ChatTemplate

# Every pattern of transformers' clean-up pass (" ." -> ".", " n't" -> "n't", ...), spaced as
# the clean-up expects, so that a decode with and one without it differ on this text.
_PROBE = "a . b ? c ! d , e ' f do n't I 'm it 's we 've they 're"


def _fast_decoder(tokenizer):
    """(the Rust tokenizer behind a fast tokenizer, the clean-up to apply after it or None) when
    the two reproduce tokenizer.batch_decode; None for a slow tokenizer or one they do not.

    Whether batch_decode cleans up spaces depends on the transformers version, not only on
    tokenizer.clean_up_tokenization_spaces (5.24 skips it for BPE models, older versions apply
    it), so it is observed once on _PROBE, with and without special tokens, not looked up. A
    tokenizer the probe cannot run on keeps batch_decode: the fast path is never a job's error.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        probe = tokenizer.encode(_PROBE, add_special_tokens=False)
        ids = probe + tokenizer.all_special_ids[:1] + probe
        both = (True, False)
        raw = [backend.decode(ids, skip_special_tokens=skip) for skip in both]
        slow = [tokenizer.batch_decode([ids], skip_special_tokens=skip)[0] for skip in both]
        clean_up = tokenizer.clean_up_tokenization
        cleaned = [clean_up(text) for text in raw]
        cleans_up = getattr(tokenizer, "clean_up_tokenization_spaces", True)
    except Exception:  # an unusual tokenizer: transformers' own decode, as before the probe
        return None
    telling = cleaned != raw  # else the probe cannot say whether batch_decode cleans up
    if slow == raw and (telling or not cleans_up):
        return backend, None
    if slow == cleaned and telling:
        return backend, clean_up
    return None


# A prompt of token ids holds ints only (bools excluded), checked at C speed: a generator over
# 1,000 ids a row held a `trt` job's first rows for tens of milliseconds before the first step.
_INTS = frozenset({int})


class Tokenize:
    """Fills each row's prompt_ids, or marks the row as an error saying what is wrong with it."""

    def __init__(
        self, tokenizer, chat_template: bool, vocab_size: int, system: str | None = None
    ) -> None:
        """system: with the chat template, a system message before each prompt (--system)."""
        template = ChatTemplate(tokenizer, system) if chat_template else None
        self.encoder = PromptEncoder(tokenizer, template)
        self.encode = self.encoder.encode
        # OpenAI /v1/completions rows are raw text completions: never templated.
        self.encode_plain = PromptEncoder(tokenizer, None).encode
        self.vocab_size = vocab_size
        self.chat_template = chat_template
        self.conversations = Conversations(tokenizer, system)

    def __call__(self, rows: list[Row]) -> None:
        texts: list[str] = []
        text_rows: list[Row] = []
        chats: list[Row] = []
        plain: list[Row] = []
        for row in rows:
            if row.error is not None:
                continue
            if row.messages is not None:
                try:
                    row.prompt_text = self.conversations.render(checked_messages(row.messages))
                    row.api = row.api or "chat"
                    chats.append(row)
                except ValueError as e:
                    row.fail(str(e))
                continue
            if row.api is None:
                row.api = "chat" if self.chat_template else "text"
            prompt = row.prompt
            if isinstance(prompt, str):
                row.prompt_text = prompt
                if prompt and row.api == "text" and self.chat_template:
                    plain.append(row)
                elif prompt:
                    texts.append(prompt)
                    text_rows.append(row)
                else:
                    row.fail("prompt is empty")
            elif isinstance(prompt, list) and prompt and _INTS.issuperset(map(type, prompt)):
                self._check_ids(row, prompt)
            else:
                row.fail(_problem(prompt))
        pairs = []
        if texts:
            pairs += zip(text_rows, self.encode(texts), strict=True)
        if plain:
            pairs += zip(plain, self.encode_plain([r.prompt for r in plain]), strict=True)
        if chats:
            encoded = self.encoder.encode_rendered([r.prompt_text for r in chats])
            pairs += zip(chats, encoded, strict=True)
        for row, ids in pairs:  # checked too: a tokenizer may outgrow its model's vocabulary
            if ids:
                self._check_ids(row, ids)
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
        if all(isinstance(m, dict) for m in prompt):  # a conversation in the prompt column
            return (
                "prompt is a list of messages, not of token ids: name its column --messages-column"
            )
        return "prompt is a list but not of token ids (integers)"
    shown = repr(prompt)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"prompt is {type(prompt).__name__} {shown}, not a string or a list of token ids"


class Detokenize:
    """Fills each generated row's text (and the prompt text of pre-tokenized rows)."""

    def __init__(self, tokenizer, name: Callable[[int, str], str] | None = None) -> None:
        """name(token_id, text alone) -> the token's name in logprobs (TokenBytes.name: a
        SentencePiece '\u2581a' keeps its space); without it, its text alone."""
        self._tokenizer = tokenizer
        self._name = name
        self._backend, self._clean_up = _fast_decoder(tokenizer) or (None, None)
        self._texts: list[str | None] = []  # at [id]: the token's text alone, once decoded

    def __call__(self, rows: list[Row]) -> None:
        done = [r for r in rows if r.token_ids is not None]
        stopped = []
        for row, text in zip(done, self.decode([r.token_ids for r in done]), strict=True):
            row.text = text
            stops = row.params.stop if row.params is not None else ()
            # The authoritative cut: the earliest stop string and all after it leave the text.
            if stops and (cut := cut_at_stop(text, stops)) is not None:
                row.text, row.finish_reason = cut, "stop"
                stopped.append(row)
        if stopped:  # the token columns follow the text (see kept_token_counts for the rule)
            ids, texts = [r.token_ids for r in stopped], [r.text for r in stopped]
            for row, count in zip(stopped, kept_token_counts(ids, texts, self.decode), strict=True):
                keep_first_tokens(row, count)
        with_logprobs = [r for r in done if r.token_logprobs is not None]
        if with_logprobs:
            self._name_tokens(with_logprobs)
        pretokenized = [r for r in rows if r.prompt_text is None and r.prompt_ids is not None]
        if pretokenized:
            texts = self.decode([r.prompt_ids for r in pretokenized], skip_special=False)
            for row, text in zip(pretokenized, texts, strict=True):
                row.prompt_text = text

    def _name_tokens(self, rows: list[Row]) -> None:
        """Each sampled and top-logprob token as its own text (Row.token_texts, Row.top_texts);
        a row named already (a guard.py rerun) is left as it is.

        Texts come from a cache indexed by id (a list: no hashing, one memory access per token),
        which decodes each distinct id once, in one batch call for the ids new to it.
        """
        rows = [r for r in rows if r.top_texts is None]
        id_lists = [r.token_ids for r in rows]
        id_lists += [r.token_logprobs.top_ids.tolist() for r in rows]
        texts = self._texts
        top_id = max((max(ids) for ids in id_lists if ids), default=-1)
        texts += [None] * (top_id + 1 - len(texts))
        named = [list(map(texts.__getitem__, ids)) for ids in id_lists]
        new = set()
        for ids, got in zip(id_lists, named, strict=True):
            if not all(got):  # quicker than `None in got`; a "" text only costs the scan below
                new.update(i for i, text in zip(ids, got, strict=True) if text is None)
        if new:
            order = sorted(new)
            for i, text in zip(order, self.decode([[i] for i in order], False), strict=True):
                texts[i] = text if self._name is None else self._name(i, text)
            named = [list(map(texts.__getitem__, ids)) for ids in id_lists]
        m = len(rows)  # named: the rows' sampled tokens, then their top entries
        for row, token_texts, top_texts in zip(rows, named[:m], named[m:], strict=True):
            row.token_texts, row.top_texts = token_texts, top_texts

    def decode(self, ids: list[list[int]], skip_special: bool = True) -> list[str]:
        if not ids:
            return []
        if self._backend is None:
            return self._tokenizer.batch_decode(ids, skip_special_tokens=skip_special)
        texts = self._backend.decode_batch(ids, skip_special_tokens=skip_special)
        if self._clean_up is not None:  # a chain of str.replace: C speed, short GIL holds
            texts = list(map(self._clean_up, texts))
        return texts
