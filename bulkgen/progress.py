"""Counters of a run and the progress bar that shows them (stderr, off with --quiet)."""

from __future__ import annotations

import sys
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
    ) -> None:
        """report: also called with the counts of each batch of rows (a data-parallel worker
        sends them to its parent's bar)."""
        self.counts = Counts()
        self._report = report
        self._errors_before = errors
        self._bar = tqdm(
            total=total,
            initial=done,
            unit="row",
            file=sys.stderr,
            disable=quiet,
            dynamic_ncols=True,
            smoothing=0.05,
        )

    def add(self, rows: list[Row]) -> None:
        batch = Counts()
        batch.add(rows)
        if self._report is not None:
            self._report(batch)
        self.add_counts(batch)

    def add_counts(self, batch: Counts) -> None:
        self.counts.merge(batch)
        c = self.counts
        errors = self._errors_before + c.errors
        self._bar.set_postfix_str(f"{c.tokens_per_s:,.0f} tok/s, {errors} errors", refresh=False)
        self._bar.update(batch.rows)

    def close(self) -> None:
        self._bar.close()
