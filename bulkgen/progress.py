"""Counters of a run and the progress display that shows them (stderr, off with --quiet).

On a terminal it is a tqdm bar, refreshed every second. Anywhere else (a log file, a scheduler's
captured output) a bar redrawn every second is noise, so it is one plain line every 30 s:

    bulkgen: 120/1,000 rows (12.0%), 0 errors, 45.2 tok/s, 2m05s elapsed, ETA 15m16s

With --n K the results are samples, and the display counts input rows (all their samples
written) and samples separately.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from tqdm import tqdm

from bulkgen.row import Row

if TYPE_CHECKING:
    from bulkgen.io.job import Done

# The counts a job's complete shards hold (io/job.Done) as a run's (Counts) do.
COUNT_FIELDS = ("rows", "errors", "prompt_tokens", "completion_tokens")
LOG_INTERVAL_S = 30.0
_BAR_REFRESH_S = 1.0


@dataclass
class Counts:
    rows: int = 0  # results written: input rows, or their samples with --n
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    inputs: int = 0  # input rows all of whose samples (of this run) are written

    def add(self, rows: list[Row]) -> None:
        self.rows += len(rows)
        for row in rows:
            if row.finish_reason == "error":
                self.errors += 1
            self.prompt_tokens += row.prompt_tokens
            self.completion_tokens += row.completion_tokens

    @classmethod
    def between(cls, start: Done, end: Done) -> Counts:
        """What a run wrote, from what complete shards held at its start and hold at its end:
        the counts a resume takes (with --format openai a failed row is one error line and a
        line's prompt tokens count once, whatever --n, where the progress counts each sample)."""
        return cls(*(getattr(end, k) - getattr(start, k) for k in COUNT_FIELDS))

    def merge(self, other: Counts) -> None:
        self.rows += other.rows
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.inputs += other.inputs

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / max(self.elapsed, 1e-9)


def format_rate(value: float) -> str:
    """Tokens/s with decimals when small (0.42, 7.5), whole when large (1,234)."""
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Results done of the total (when known), generated tokens/s and errors so far."""

    def __init__(
        self,
        total: int | None,
        done: int,
        errors: int,
        quiet: bool,
        report: Callable[[Counts], None] | None = None,
        live_tokens: Callable[[], int | None] | None = None,
        n: int = 1,
        stream: TextIO | None = None,
        interval: float = LOG_INTERVAL_S,
    ) -> None:
        """total and done count results (samples with n > 1). report: also called with the
        counts of each batch of rows (a data-parallel worker sends them to its parent's bar).
        live_tokens: the engine's count of generated tokens, so tokens/s moves while long
        completions are still running (rows finish in bursts). stream: where to show it
        (stderr); interval: seconds between plain lines when it is not a terminal."""
        self.counts = Counts()
        self.n = n
        self._total, self._done = total, done
        self._report = report
        self._errors_before = errors
        self._live_tokens = live_tokens
        self._open: dict[int, int] = {}  # an input row's group -> its samples written so far
        self._stream = stream or sys.stderr
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        is_tty = getattr(self._stream, "isatty", lambda: False)()
        self._bar = None
        if not quiet and is_tty:
            self._bar = tqdm(
                total=total,
                initial=done,
                unit="row" if n == 1 else "sample",
                file=self._stream,
                dynamic_ncols=True,
                smoothing=0.05,
            )
            if live_tokens is not None:
                self._start(self._refresh_bar, _BAR_REFRESH_S)
        elif not quiet:
            self._start(self._log_line, interval)

    def _start(self, tick: Callable[[], None], interval: float) -> None:
        def loop() -> None:
            while not self._closed.wait(interval):
                tick()

        self._thread = threading.Thread(target=loop, daemon=True, name="bulkgen-progress")
        self._thread.start()

    def _tokens_per_s(self) -> float:
        if self._live_tokens is not None:
            n = self._live_tokens()  # counted from 0 by the engine this run made
            if n is not None:
                return n / max(self.counts.elapsed, 1e-9)
        return self.counts.tokens_per_s

    def _postfix(self) -> str:
        errors = self._errors_before + self.counts.errors
        rows = f"{self.counts.inputs:,} rows done, " if self.n > 1 else ""
        return f"{rows}{format_rate(self._tokens_per_s())} tok/s, {errors} errors"

    def _refresh_bar(self) -> None:
        self._bar.set_postfix_str(self._postfix(), refresh=True)

    def line(self) -> str:
        """The plain progress line (what a non-terminal gets every interval)."""
        c = self.counts
        done = self._done + c.rows
        unit = "rows" if self.n == 1 else "samples"
        what = f"{done:,}/{self._total:,} {unit}" if self._total else f"{done:,} {unit}"
        if self._total:
            what += f" ({100 * done / self._total:.1f}%)"
        if self.n > 1:
            what += f" ({c.inputs:,} input rows done this run)"
        errors = self._errors_before + c.errors
        text = f"bulkgen: {what}, {errors} errors, {format_rate(self._tokens_per_s())} tok/s"
        text += f", {format_duration(c.elapsed)} elapsed"
        if self._total and c.rows:
            left = (self._total - done) * c.elapsed / c.rows
            text += f", ETA {format_duration(left)}"
        return text

    def _log_line(self) -> None:
        try:
            print(self.line(), file=self._stream, flush=True)
        except (OSError, ValueError):  # the log went away: progress is not worth failing for
            pass

    def add(self, rows: list[Row]) -> None:
        batch = Counts()
        batch.add(rows)
        for row in rows:
            seen = self._open.get(row.group, 0) + 1
            if seen >= row.group_size:
                self._open.pop(row.group, None)
                batch.inputs += 1
            else:
                self._open[row.group] = seen
        if self._report is not None:
            self._report(batch)
        self.add_counts(batch)

    def add_counts(self, batch: Counts) -> None:
        self.counts.merge(batch)
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(batch.rows)

    def close(self) -> None:
        """Stop the display; its thread is joined (nothing of ours outlives the run)."""
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._bar is not None:
            self._bar.close()
