"""Bounded queues between pipeline stages that give up when the pipeline is stopping.

Every put and get wakes up now and then to look at the shared stop event, so a stage blocked on a
full or empty queue never outlives a failure elsewhere: the whole pipeline stops promptly.
"""

from __future__ import annotations

import queue
import threading

_POLL_S = 0.05
_CLOSED = object()


class _Empty:
    def __repr__(self) -> str:
        return "EMPTY"


# What get(block=False) returns when nothing is queued; distinct from None, which means closed.
EMPTY = _Empty()


class Stopped(Exception):
    """Raised in a stage when another stage failed or the run was interrupted."""


class Channel:
    """A bounded FIFO with an end-of-stream marker. One producer closes it when done."""

    def __init__(self, maxsize: int, stop: threading.Event) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize)
        self._stop = stop

    def put(self, item: object) -> None:
        while True:
            if self._stop.is_set():
                raise Stopped
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def check(self) -> None:
        """Raise Stopped if the pipeline is stopping (for a loop that may not touch the
        channel for a while, such as the engine's between finished requests)."""
        if self._stop.is_set():
            raise Stopped

    def close(self) -> None:
        self.put(_CLOSED)

    def get(self, block: bool = True) -> object:
        """The next item; None once the producer has closed the channel; EMPTY if not blocking
        and nothing is queued."""
        while True:
            if self._stop.is_set():
                raise Stopped
            try:
                item = self._queue.get(timeout=_POLL_S) if block else self._queue.get_nowait()
            except queue.Empty:
                if not block:
                    return EMPTY
                continue
            return None if item is _CLOSED else item
