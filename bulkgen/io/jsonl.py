"""JSONL inputs (plain or gzip, OpenAI Batch files too), parsed line by line.

One bad line becomes one error record instead of failing its whole block.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bulkgen.io.inputs import Source
from bulkgen.io.openai import batch_row, is_batch_record
from bulkgen.row import PARAM_COLUMNS, Row, param_overrides

if TYPE_CHECKING:
    from bulkgen.io.reader import Reader

# A JSONL field is taken as missing from the file only if none of its first rows has it.
_JSONL_PROBE_ROWS = 100


def open_jsonl(path: Path):
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)


def jsonl_fields(path: Path) -> set[str] | None:
    fields: set[str] = set()
    parsed = 0
    with open_jsonl(path) as f:
        for line in f:
            if parsed >= _JSONL_PROBE_ROWS:
                break
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                fields.update(record)
                parsed += 1
    return fields if parsed else None


def read_jsonl(reader: Reader, source: Source) -> Iterator[list[Row]]:
    prompt_col, id_col, keep = reader.prompt_column, reader.id_column, reader.keep_columns
    templated = reader.template_columns
    chat_col = reader.messages_column
    batch_file = is_batch_file(source)
    prefix = source.name + ":"
    batch: list[Row] = []
    index = 0
    with open_jsonl(source.paths[0]) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row_id = prefix + str(index)
            index += 1
            try:
                record = json.loads(line)
            except ValueError as e:
                row = Row(row_id, None)
                row.fail(f"line {lineno} is not valid JSON: {_json_problem(e)}")
            else:
                # A conversation has no prompt but messages: read like a prompt, then moved.
                chat = (
                    templated is None
                    and isinstance(record, dict)
                    and record.get(prompt_col) is None
                    and chat_col in record
                )
                column = chat_col if chat else prompt_col
                if batch_file:
                    row = _batch_row(record, row_id, lineno, keep)
                else:
                    row = _jsonl_row(record, row_id, lineno, column, id_col, keep, templated)
                if chat and not batch_file:
                    row.messages, row.prompt = row.prompt, None
                    if row.messages is None and row.error is None:
                        row.fail("messages is null")
            batch.append(row)
            if len(batch) >= reader.batch_rows:
                yield batch
                batch = []
    if batch:
        yield batch


def is_batch_file(source: Source) -> bool:
    """An OpenAI Batch input file: its first parsable line has custom_id and body."""
    if source.kind != "jsonl":
        return False

    def first_record():
        with open_jsonl(source.paths[0]) as f:
            for line in f:
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        return None

    return is_batch_record(first_record())


def _batch_row(record, row_id, lineno, keep) -> Row:
    if not is_batch_record(record):
        row = Row(row_id, None)
        row.fail(f"line {lineno} is not an OpenAI batch request (it needs custom_id and body)")
        return row
    row = batch_row(record, lineno)
    if keep:
        row.extra = {name: record.get(name) for name in keep}
    return row


def _json_problem(e: ValueError) -> str:
    return e.msg if isinstance(e, json.JSONDecodeError) else str(e)


def _jsonl_row(record, row_id, lineno, prompt_col, id_col, keep, templated=None) -> Row:
    if not isinstance(record, dict):
        row = Row(row_id, None)
        row.fail(f"line {lineno} is a JSON {type(record).__name__}, not an object")
        return row
    given_id = record.get(id_col)
    row = Row(row_id if given_id is None else str(given_id), record.get(prompt_col))
    if keep:
        row.extra = {name: record.get(name) for name in keep}
    row.overrides = param_overrides({name: record.get(name) for name in PARAM_COLUMNS})
    if templated is not None:  # --prompt-template: the template makes the prompt
        row.columns = {name: record[name] for name in templated if name in record}
    elif prompt_col not in record:
        row.fail(f"line {lineno} has no {prompt_col!r} field")
    return row


def count_lines(path: Path) -> int:
    """Non-blank lines. A big file is only scanned for newlines: blank lines there are rare."""
    with open(path, "rb", buffering=1 << 20) as f:
        if path.stat().st_size < 1 << 26:
            return sum(1 for line in f if line.strip())
        count, tail = 0, b"\n"
        while chunk := f.read(1 << 22):
            count += chunk.count(b"\n")
            tail = chunk[-1:]
        return count + (tail != b"\n")
