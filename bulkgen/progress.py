"""Counters of a run and the progress bar that shows them (stderr, off with --quiet)."""

from __future__ import annotations

import sys
import time
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

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / max(self.elapsed, 1e-9)


class Progress:
    """Rows done of the total (when known), generated tokens/s and errors so far."""

    def __init__(self, total: int | None, done: int, errors: int, quiet: bool) -> None:
        self.counts = Counts()
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
        self.counts.add(rows)
        c = self.counts
        errors = self._errors_before + c.errors
        self._bar.set_postfix_str(f"{c.tokens_per_s:,.0f} tok/s, {errors} errors", refresh=False)
        self._bar.update(len(rows))

    def close(self) -> None:
        self._bar.close()
