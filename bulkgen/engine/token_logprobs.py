"""Per-token logprobs held flat, in buffers the garbage collector never traverses.

A logprob job keeps, per generated token, the sampled token's logprob and its top-k alternatives.
As Python objects (a float, a list of k (id, logprob) tuples) that is k + 2 containers per token,
and a full collection visits each of them and every reference they hold: with a 1,000-row shard
of 544 tokens x top-5 alive, one gc.collect() held the GIL for about 0.2 s, stalling the engine
thread. Here a request's logprobs grow in array.array buffers (one GC visit each, whatever
their length: Python 3.11 tracks arrays only to reach their type) and are handed on as read-only
numpy views of them, which the GC does not track. Position p's top-k entries are
[p*k, (p+1)*k), best first.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np


class LogprobRecorder:
    """A running request's logprobs, appended one generated token at a time."""

    __slots__ = ("k", "chosen", "top_ids", "top_logprobs")

    def __init__(self, k: int) -> None:
        self.k = k
        self.chosen = array("d")
        self.top_ids = array("q")
        self.top_logprobs = array("d")

    def append(self, chosen: float, top_ids: memoryview, top_logprobs: memoryview) -> None:
        """One token: its logprob, and the bytes of its k top ids (int64) and logprobs (float64)."""
        self.chosen.append(chosen)
        self.top_ids.frombytes(top_ids)
        self.top_logprobs.frombytes(top_logprobs)

    def freeze(self) -> TokenLogprobs:
        chosen = _frozen(self.chosen, np.float64)
        top_ids, top_logprobs = (
            _frozen(self.top_ids, np.int64),
            _frozen(self.top_logprobs, np.float64),
        )
        return TokenLogprobs(self.k, chosen, top_ids, top_logprobs)


def _frozen(buffer: array, dtype: type) -> np.ndarray:
    """A read-only view, no copy: a copy of every finished request's buffers costs the engine
    thread fresh pages (page faults) for nothing. The array cannot grow while viewed."""
    out = np.frombuffer(buffer, dtype)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, slots=True, eq=False)
class TokenLogprobs:
    """A finished request's logprobs: per generated position, the sampled token's logprob
    (chosen[p]) and its top-k alternatives (top_ids and top_logprobs [p*k, (p+1)*k))."""

    k: int
    chosen: np.ndarray  # float64, one per position
    top_ids: np.ndarray  # int64, k per position
    top_logprobs: np.ndarray  # float64, k per position

    @classmethod
    def from_pairs(
        cls, chosen: list[float], pairs: list[list[tuple[int, float]]], k: int
    ) -> TokenLogprobs:
        """From per-position lists of k (token_id, logprob) pairs."""
        rec = LogprobRecorder(k)
        rec.chosen.extend(chosen)
        for position in pairs:
            assert len(position) == k, f"{len(position)} pairs at a position, not {k}"
            rec.top_ids.extend(i for i, _ in position)
            rec.top_logprobs.extend(v for _, v in position)
        return rec.freeze()

    def __len__(self) -> int:
        return len(self.chosen)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenLogprobs):
            return NotImplemented
        pairs = zip(self.columns(), other.columns(), strict=True)
        return self.k == other.k and all(np.array_equal(a, b) for a, b in pairs)

    __hash__ = None  # type: ignore[assignment]

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.chosen, self.top_ids, self.top_logprobs

    def first(self, positions: int) -> TokenLogprobs:
        """The first `positions` positions (views: no copy)."""
        end = positions * self.k
        return TokenLogprobs(
            self.k, self.chosen[:positions], self.top_ids[:end], self.top_logprobs[:end]
        )

    def pairs(self) -> list[list[tuple[int, float]]]:
        """Per position, its top (token_id, logprob) pairs as Python objects."""
        if self.k == 0:
            return [[] for _ in range(len(self))]
        pairs = list(zip(self.top_ids.tolist(), self.top_logprobs.tolist(), strict=True))
        return [pairs[i : i + self.k] for i in range(0, len(pairs), self.k)]
