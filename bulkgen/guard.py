"""A guard around a per-row stage: an exception on one row is that row's error record.

A stage function works on a whole batch. If it raises, the guard runs it again on each row of
the batch alone; a row it still raises on becomes an error record naming the stage and the
exception (a row fault, a bug to report, counted in stats.json as `row_faults`), and the other
rows go on. The functions guarded may be run twice on a row: they must redo, not accumulate.
"""

from __future__ import annotations

from collections.abc import Callable

from bulkgen.channel import Stopped
from bulkgen.row import Row


class RowGuard:
    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.faults = 0  # only its own stage's thread adds to it

    def __call__(self, fn: Callable[[list[Row]], list[Row] | None], rows: list[Row]) -> list[Row]:
        """fn(rows), or what it gives row by row; fn returns its rows (or None: the same rows)."""
        try:
            out = fn(rows)
            return rows if out is None else out
        except Stopped:
            raise
        except Exception:
            pass
        kept: list[Row] = []
        for row in rows:
            try:
                out = fn([row])
                kept += [row] if out is None else out
            except Stopped:
                raise
            except Exception as e:
                self.faults += 1
                fault(row, f"{self.stage} failed on this row: {type(e).__name__}: {e}")
                kept.append(row)
        return kept


def fault(row: Row, message: str) -> None:
    """Make the row an error record holding nothing but what is safe to write."""
    row.fail(message)
    row.text = row.token_ids = row.token_logprobs = row.token_texts = row.top_texts = None
    row.params = None
