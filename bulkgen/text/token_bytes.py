"""Each token's own UTF-8 bytes, as OpenAI's logprobs give them (`bytes`).

A token's decoded text is not enough: a token that holds part of a multi-byte character decodes
alone to U+FFFD, whose bytes are not the token's, so the pieces of the character no longer join.
The bytes come from the vocabulary instead: a byte-level BPE (GPT-2's, Llama-3's, Qwen's) spells
each byte as one printable character (GPT-2's bytes_to_unicode table), and a SentencePiece
vocabulary with byte fallback has a token `<0xE2>` per byte, and spells a space "▁" (which a
token decoded alone loses at its start). Any other token's bytes are its text's. Each id is
worked out once: a job names the same few thousand ids over and over.
"""

from __future__ import annotations

import json
import re

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPACE = "\u2581"  # SentencePiece's word boundary, a space in the text


def byte_level_table() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable bytes stand for themselves, the others for
    the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    table = {chr(b): b for b in kept}
    others = [b for b in range(256) if chr(b) not in table]
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


class TokenBytes:
    """token_bytes(token_id, text) -> the token's bytes, where text is its decoded text alone."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._known: dict[int, list[int]] = {}
        self._shown: dict[int, bool] = {}
        self._table: dict[str, int] | None = None  # a byte-level BPE's, once looked at
        self._added: set[int] | None = None  # added tokens' ids: their text is as written

    def __call__(self, token_id: int, text: str) -> list[int]:
        known = self._known.get(token_id)
        if known is None:
            known = self._known[token_id] = self._bytes(token_id, text)
        return known

    def name(self, token_id: int, text: str) -> str:
        """The token's name in logprobs: its own bytes as text where they are whole UTF-8
        characters (a SentencePiece word-initial piece is ' a', with the space its text decoded
        alone loses), else its text (a piece of a character: U+FFFD)."""
        return spelled(text, self(token_id, text))

    def in_text(self, token_id: int) -> bool:
        """Whether the token shows in a completion's text, which is decoded without special
        tokens (a special token the model generates, <s> say, is named in logprobs but adds no
        character to the text)."""
        shown = self._shown.get(token_id)
        if shown is None:
            decode = self._tokenizer.decode
            alone = decode([token_id], skip_special_tokens=True)
            shown = alone != "" or decode([token_id], skip_special_tokens=False) == ""
            self._shown[token_id] = shown
        return shown

    def _bytes(self, token_id: int, text: str) -> list[int]:
        if self._added is None:
            self._table = byte_level_table() if _is_byte_level(self._tokenizer) else None
            self._added = set(getattr(self._tokenizer, "added_tokens_decoder", None) or ())
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and token_id not in self._added:
            table = self._table
            if table is not None and all(c in table for c in piece):
                return [table[c] for c in piece]
            # A vocabulary's literal "<0xE2>" text decodes as itself; a byte token does not.
            if table is None and (byte := _BYTE_TOKEN.fullmatch(piece)) and text != piece:
                return [int(byte.group(1), 16)]
            if table is None and _SPACE in piece:  # SentencePiece: its own text, spaces kept
                return list(piece.replace(_SPACE, " ").encode())  # (alone, decode drops one)
        return list(text.encode())


def spelled(text: str, raw: list[int]) -> str:
    """A token's name from its own bytes when they are whole UTF-8 characters, else its text."""
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return text


def _is_byte_level(tokenizer) -> bool:
    """Whether the tokenizer decodes with a byte-level decoder (for a slow one: has GPT-2's
    byte_decoder)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return hasattr(tokenizer, "byte_decoder")
    decoder = backend.decoder
    try:
        return decoder is not None and _has_type(json.loads(decoder.__getstate__()), "ByteLevel")
    except (TypeError, ValueError):  # an unusual decoder: its bytes are its texts'
        return False


def _has_type(spec: object, name: str) -> bool:
    """Whether a decoder's JSON form, or one of a Sequence's decoders, is of type name."""
    if isinstance(spec, dict):
        return spec.get("type") == name or any(_has_type(v, name) for v in spec.values())
    if isinstance(spec, list):
        return any(_has_type(v, name) for v in spec)
    return False
