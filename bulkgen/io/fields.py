"""One input record (a JSON object, or a table row's columns) to a checked Row.

JSONL and tabular inputs (Parquet, Arrow, CSV) share this, so that the same bad value gives the
same error record whatever file it came in. Nothing a record holds raises past its own row: an
unexpected exception while building it becomes the row's error record (a row fault).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulkgen.io.schema import fit_kept
from bulkgen.io.validate import check_row, checked_id
from bulkgen.row import PARAM_COLUMNS, Row, param_overrides

if TYPE_CHECKING:
    from bulkgen.io.reader import Reader


def row_from(
    reader: Reader, values: dict, default_id: str, where: str, params: dict | None = None
) -> Row:
    """The Row for one record; where ("row 3, line 4") names it in structural errors. params:
    the per-row parameters' values where they differ from values' (a CSV's, parsed as numbers:
    the kept and template columns keep the text)."""
    row_id, bad_id = checked_id(values.get(reader.id_column), default_id)
    row = Row(row_id, None)
    if reader.keep_columns:
        row.extra = {name: values.get(name) for name in reader.keep_columns}
    params = values if params is None else params
    row.overrides = param_overrides({name: params.get(name) for name in PARAM_COLUMNS})
    prompt = values.get(reader.prompt_column)
    if reader.template_columns is not None:  # --prompt-template: the template makes the prompt
        row.prompt = prompt
        row.columns = {n: values[n] for n in reader.template_columns if n in values}
    elif reader.messages_column == reader.prompt_column and is_conversation(prompt):
        row.messages = prompt  # --messages-column naming the prompt column (TRL's "prompt")
    elif prompt is None and reader.messages_column in values:  # a conversation
        row.messages = values[reader.messages_column]
        if row.messages is None:
            row.fail(f"{reader.messages_column} is null")
    elif reader.prompt_column not in values:
        row.fail(f"{where}: no {reader.prompt_column!r} field")
    else:
        row.prompt = prompt
    if bad_id is not None:
        row.fail(bad_id)
    return row


def is_conversation(value: object) -> bool:
    """Whether a prompt column's value is a list of messages (dicts) rather than of token ids."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def finished(
    reader: Reader, row: Row, index: int, line: int = 0, trusted: frozenset = frozenset()
) -> Row:
    """The row with its position set, its values checked and its kept columns fitted to the job's
    schema."""
    row.index, row.line = index, line
    check_row(row, reader.grammar_checks)
    if row.extra and reader.keep_types:
        fit_kept(row, reader.keep_types, trusted)
    return row


def faulted(reader: Reader, default_id: str, index: int, line: int, e: Exception) -> Row:
    """The error record of a row that raised while being read (a bug, counted in stats)."""
    reader.faults += 1
    row = Row(default_id, None)
    row.fail(f"reading this row failed: {type(e).__name__}: {e}")
    row.index, row.line = index, line
    return row
