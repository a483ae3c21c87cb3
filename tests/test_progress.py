"""The progress display: a plain line every interval off a terminal, rows and samples apart."""

from __future__ import annotations

import io
import re
import time

from bulkgen.cli import summary
from bulkgen.progress import Progress, format_duration, format_rate
from bulkgen.row import Row


def results(group: int, samples: int, tokens: int = 5) -> list[Row]:
    return [Row(id=f"r{group}", prompt="p", prompt_ids=[1, 2], token_ids=[7] * tokens,
                finish_reason="stop", sample=k, group=group, group_size=samples)
            for k in range(samples)]  # fmt: skip


def test_off_a_terminal_it_prints_one_plain_line_per_interval_and_no_bar():
    stream = io.StringIO()  # not a TTY, as a log file or a scheduler's capture
    progress = Progress(100, 0, 0, quiet=False, stream=stream, interval=0.2)
    progress.add(results(1, 1) + results(2, 1))
    time.sleep(0.5)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert 1 <= len(lines) <= 3, lines  # one per interval, not a redraw per update
    assert "\r" not in stream.getvalue()
    assert re.fullmatch(
        r"bulkgen: 2/100 rows \(2\.0%\), 0 errors, [\d.]+ tok/s, \ds elapsed, ETA \d+s", lines[0]
    ), lines[0]


def test_quiet_prints_nothing_and_starts_no_thread():
    stream = io.StringIO()
    progress = Progress(10, 0, 0, quiet=True, stream=stream, interval=0.01)
    time.sleep(0.05)
    progress.close()
    assert stream.getvalue() == "" and progress._thread is None


def test_with_n_it_counts_input_rows_and_samples_apart():
    progress = Progress(12, 0, 0, quiet=True, n=4)
    progress.add(results(1, 4) + results(2, 4)[:2])  # row 1 whole, row 2 half done
    assert progress.counts.rows == 6 and progress.counts.inputs == 1
    progress.add(results(2, 4)[2:])
    assert progress.counts.inputs == 2
    assert progress.line().startswith("bulkgen: 8/12 samples (66.7%) (2 input rows done")


def test_the_summary_counts_input_rows_and_samples_apart():
    stats = {"this_run": {"rows": 8, "errors": 0, "input_rows": 2}, "rows": 8,
             "wall_time_s": 2.0, "generated_tokens_per_s": 3.456}  # fmt: skip
    line = summary(stats, "out", n=4)
    assert line.startswith("8 results (4 samples a row) of 2 input rows (0 errors) written to out")
    assert "3.46 generated tokens/s" in line


def test_small_rates_show_decimals():
    assert [format_rate(x) for x in (0.4217, 7.5, 42.25, 1234.5)] == ["0.42", "7.50", "42.2",
                                                                       "1,234"]  # fmt: skip
    assert [format_duration(s) for s in (5, 125, 7260)] == ["5s", "2m05s", "2h01m"]
