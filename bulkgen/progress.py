"""Counters of a run and the progress bar that shows them (stderr, off with --quiet)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from bulkgen.row import Row


@dataclass
class Counts:
    rows: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, rows: list[Row]) -> None:
        self.rows += len(rows)
        for row in rows:
            if row.finish_reason == "error":
                self.errors += 1
            self.prompt_tokens += row.prompt_tokens
            self.completion_tokens += row.completion_tokens

    def merge(self, other: Counts) -> None:
        self.rows += other.rows
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / max(self.elapsed, 1e-9)


class Progress:
    """Rows done of the total (when known), generated tokens/s and errors so far."""

    def __init__(
        self,
        total: int | None,
        done: int,
        errors: int,
        quiet: bool,
        report: Callable[[Counts], None] | None = None,
        live_tokens: Callable[[], int | None] | None = None,
    ) -> None:
        """report: also called with the counts of each batch of rows (a data-parallel worker
        sends them to its parent's bar). live_tokens: the engine's count of generated tokens,
        so tokens/s moves while long completions are still running (rows finish in bursts)."""
        self.counts = Counts()
        self._report = report
        self._errors_before = errors
        self._live_tokens = live_tokens
        self._closed = threading.Event()
        self._bar = tqdm(
            total=total,
            initial=done,
            unit="row",
            file=sys.stderr,
            disable=quiet,
            dynamic_ncols=True,
            smoothing=0.05,
        )
        if live_tokens is not None and not quiet:
            threading.Thread(target=self._refresh_loop, daemon=True, name="progress").start()

    def _tokens_per_s(self) -> float:
        if self._live_tokens is not None:
            n = self._live_tokens()  # counted from 0 by the engine this run made
            if n is not None:
                return n / max(self.counts.elapsed, 1e-9)
        return self.counts.tokens_per_s

    def _postfix(self) -> str:
        errors = self._errors_before + self.counts.errors
        return f"{self._tokens_per_s():,.0f} tok/s, {errors} errors"

    def _refresh_loop(self) -> None:
        while not self._closed.wait(1.0):
            self._bar.set_postfix_str(self._postfix(), refresh=True)

    def add(self, rows: list[Row]) -> None:
        batch = Counts()
        batch.add(rows)
        if self._report is not None:
            self._report(batch)
        self.add_counts(batch)

    def add_counts(self, batch: Counts) -> None:
        self.counts.merge(batch)
        self._bar.set_postfix_str(self._postfix(), refresh=False)
        self._bar.update(batch.rows)

    def close(self) -> None:
        self._closed.set()
        self._bar.close()
