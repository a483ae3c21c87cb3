"""Where each character of a UTF-8 byte string decoded with errors="replace" starts, as Python
decodes it: completions logprobs' text_offset (io/openai.py) gives each token the index of the
character its first byte belongs to.

Python replaces each maximal ill-formed subpart with one U+FFFD (the Unicode Standard's practice,
Table 3-7's well-formed sequences): a lead byte with the continuation bytes that could still
begin a valid sequence, which an unexpected byte or the end cuts short, is one U+FFFD, and the
unexpected byte starts the next character. So a lead byte a token leaves dangling is a character
of its own, and the next token's first character follows it.
"""

from __future__ import annotations

from bisect import bisect_right

_TAIL = (0x80, 0xBF)
# A lead byte's well-formed continuation ranges (Table 3-7); any other lead is one bad byte.
_SEQUENCES: dict[int, tuple[tuple[int, int], ...]] = {}
for _lead in range(0xC2, 0xE0):
    _SEQUENCES[_lead] = (_TAIL,)
_SEQUENCES[0xE0] = ((0xA0, 0xBF), _TAIL)
for _lead in (*range(0xE1, 0xED), 0xEE, 0xEF):
    _SEQUENCES[_lead] = (_TAIL, _TAIL)
_SEQUENCES[0xED] = ((0x80, 0x9F), _TAIL)
_SEQUENCES[0xF0] = ((0x90, 0xBF), _TAIL, _TAIL)
for _lead in range(0xF1, 0xF4):
    _SEQUENCES[_lead] = (_TAIL, _TAIL, _TAIL)
_SEQUENCES[0xF4] = ((0x80, 0x8F), _TAIL, _TAIL)


def character_starts(data: bytes) -> list[int]:
    """The byte index at which each character of data.decode("utf-8", "replace") starts."""
    if data.isascii():  # most completions: a character a byte, no byte loop in Python
        return list(range(len(data)))
    starts, i, n = [], 0, len(data)
    while i < n:
        starts.append(i)
        tails = _SEQUENCES.get(data[i], ()) if data[i] >= 0x80 else ()
        i += 1
        for low, high in tails:
            if i >= n or not low <= data[i] <= high:
                break
            i += 1
    return starts


def token_offsets(pieces: list[bytes], start: int = 0) -> list[int]:
    """For each token's bytes (in order), the index in start + the decoded text of the character
    holding its first byte; a token of no bytes takes the offset the next character would."""
    data = b"".join(pieces)
    starts = character_starts(data)
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(start + bisect_right(starts, at) - (1 if at < len(data) else 0))
        at += len(piece)
    return offsets
