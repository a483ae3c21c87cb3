"""Stop strings: found in the running requests' text off the engine thread, cut out at the end.

The engine thread forwards the new tokens of requests that have stop strings (the engine's
take_progress()) to the watcher's thread, which detokenizes them incrementally and sends back the
ids of the requests whose text now holds a stop string; the engine loop aborts those before its
next step, so no decode is wasted past a stop string for more than a step or two.

The watcher only ends requests early. The final text is cut by cut_at_stop() in the detokenizer,
on the whole decoded output: that cut is authoritative, whatever the watcher saw or missed. The
token columns (token ids, logprobs, top logprobs) are cut to match by kept_token_counts(), so a
rerun writes the same rows however many tokens the engine made before the abort landed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from bulkgen.channel import Stopped
from bulkgen.row import Row

_INBOX_BATCHES = 64
_POLL_S = 0.05
_CLOSE = object()


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str | None:
    """text up to its earliest stop string, or None if it holds none."""
    cuts = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return text[: min(cuts)] if cuts else None


def kept_token_counts(
    ids: list[list[int]], texts: list[str], decode: Callable[[list[list[int]]], list[str]]
) -> list[int]:
    """How many leading token ids each output cut at a stop string keeps, given its cut text.

    The rule: the fewest leading tokens whose decoded text starts with the cut text. A stop string
    that begins on a token boundary drops the token it begins with, and decode(kept) == text; one
    that begins inside a token keeps that token, whose first characters are the end of the text
    (decode(kept) is text plus the start of the stop string). Only the tokens up to the stop
    string decide it. Found by bisection, each step one decode call for all outputs: decoding a
    longer prefix only appends characters.
    """
    lo, hi = [0] * len(ids), [len(i) for i in ids]
    while active := [j for j in range(len(ids)) if lo[j] < hi[j]]:
        mids = [(lo[j] + hi[j]) // 2 for j in active]
        decoded = decode([ids[j][:m] for j, m in zip(active, mids, strict=True)])
        for j, m, text in zip(active, mids, decoded, strict=True):
            if text.startswith(texts[j]):
                hi[j] = m
            else:
                lo[j] = m + 1
    return lo


def keep_first_tokens(output, count: int) -> None:
    """Cut an output's token columns (a Row or a RequestOutput) to its first `count` tokens."""
    output.token_ids = output.token_ids[:count]
    if output.token_logprobs is not None:
        output.token_logprobs = output.token_logprobs.first(count)
    if isinstance(output, Row) and output.top_texts is not None:  # named already: a guard rerun
        output.token_texts = output.token_texts[:count]
        output.top_texts = output.top_texts[: count * output.token_logprobs.k]


@dataclass
class _Watch:
    """One running request's output as far as the watcher has seen it."""

    stops: tuple[str, ...]
    ids: list[int] = field(default_factory=list)
    text: str = ""
    # Incremental decoding: text holds decode(ids[:read]); ids[prefix:read] is re-decoded with
    # the new ids, so that a character split over several tokens comes out whole.
    prefix: int = 0
    read: int = 0
    found: bool = False


class StopWatcher:
    """Engine-thread side: watch(), send(), take_aborts(), close(). Its own thread: run()."""

    def __init__(self, decode: Callable[[list[list[int]]], list[str]], stop: threading.Event):
        self._decode = decode
        self._stop = stop
        self._inbox: queue.Queue = queue.Queue(_INBOX_BATCHES)
        self._aborts: queue.SimpleQueue = queue.SimpleQueue()
        # Engine-thread state: events not yet handed over (the inbox was full), watched ids.
        self._pending: list[tuple] = []
        self._watched: set[str] = set()

    # ---- the engine thread: never blocks while the engine runs ---------------------------

    def watch(self, request_id: str, stops: tuple[str, ...]) -> None:
        self._watched.add(request_id)
        self._pending.append(("watch", request_id, stops))

    def send(self, progress: list[tuple[str, list[int]]], finished: list) -> None:
        """Hand over new tokens of watched requests, and which of them ended."""
        if not self._watched:
            return
        events = self._pending
        events += [("tokens", request_id, ids) for request_id, ids in progress]
        for out in finished:
            if out.request_id in self._watched:
                self._watched.discard(out.request_id)
                events.append(("end", out.request_id, None))
        if not events:
            return
        try:
            self._inbox.put_nowait(events)
            self._pending = []
        except queue.Full:  # the watcher is behind: keep them for the next step
            self._pending = events

    def take_aborts(self) -> list[str]:
        ids = []
        while True:
            try:
                ids.append(self._aborts.get_nowait())
            except queue.Empty:
                return ids

    def close(self) -> None:
        for item in ([self._pending] if self._pending else []) + [_CLOSE]:
            while True:
                if self._stop.is_set():
                    raise Stopped
                try:
                    self._inbox.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue

    # ---- the watcher's thread -----------------------------------------------------------

    def run(self) -> None:
        watches: dict[str, _Watch] = {}
        while True:
            if self._stop.is_set():
                raise Stopped
            try:
                events = self._inbox.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if events is _CLOSE:
                return
            grown: dict[str, _Watch] = {}
            for kind, request_id, value in events:
                if kind == "watch":
                    watches[request_id] = _Watch(value)
                elif kind == "end":
                    watches.pop(request_id, None)
                    grown.pop(request_id, None)
                elif (w := watches.get(request_id)) is not None and not w.found:
                    w.ids += value
                    grown[request_id] = w
            if grown:
                self._scan(grown)

    def _scan(self, grown: dict[str, _Watch]) -> None:
        windows = []
        for w in grown.values():
            windows += [w.ids[w.prefix : w.read], w.ids[w.prefix :]]
        texts = self._decode(windows)
        for i, (request_id, w) in enumerate(grown.items()):
            before, now = texts[2 * i], texts[2 * i + 1]
            if len(now) <= len(before) or now.endswith("\ufffd"):
                continue  # an incomplete character: wait for its next token
            start = max(0, len(w.text) - max(len(s) for s in w.stops) + 1)
            w.text += now[len(before) :]
            w.prefix, w.read = w.read, len(w.ids)
            if cut_at_stop(w.text[start:], w.stops) is not None:
                w.found = True
                self._aborts.put(request_id)
