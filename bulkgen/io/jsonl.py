"""JSONL inputs (plain or gzip, OpenAI Batch files too), parsed line by line.

One bad line becomes one error record instead of failing its whole block: invalid JSON, invalid
UTF-8, nesting too deep to parse, anything but an object. A file that cannot be read on from some
point (a damaged .jsonl.gz) yields the rows before the damage, then raises Damaged.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from bulkgen.io.fields import faulted, finished, row_from
from bulkgen.io.inputs import Source
from bulkgen.io.openai import batch_row, is_batch_record
from bulkgen.io.schema import json_type
from bulkgen.io.validate import checked_id
from bulkgen.row import Row

if TYPE_CHECKING:
    from bulkgen.io.reader import Reader

# A JSONL field is taken as missing from the file only if none of its first rows has it; its
# kept-column type comes from the same rows.
_JSONL_PROBE_ROWS = 100
# What reading a damaged file raises (a truncated or corrupt gzip stream, a failing disk).
READ_ERRORS = (OSError, EOFError, gzip.BadGzipFile, pa.ArrowException)


class Damaged(Exception):
    """A file could not be read on from row `index` (its rows before were yielded)."""

    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.index = index


def open_jsonl(path: Path):
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)


def _probe(path: Path) -> list[dict]:
    records: list[dict] = []
    with open_jsonl(path) as f:
        for line in f:
            if len(records) >= _JSONL_PROBE_ROWS:
                break
            try:
                record = json.loads(line) if line.strip() else None
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def jsonl_fields(path: Path) -> set[str] | None:
    records = _probe(path)
    return {name for record in records for name in record} if records else None


def jsonl_types(path: Path, columns: tuple[str, ...]) -> dict[str, pa.DataType]:
    """The kept columns' types from the file's first rows (rule: bulkgen/io/schema.py)."""
    records = _probe(path)
    return {name: json_type([r.get(name) for r in records]) for name in columns}


def read_jsonl(reader: Reader, source: Source) -> Iterator[list[Row]]:
    batch_file = is_batch_file(source)
    prefix = source.name + ":"
    batch: list[Row] = []
    index = 0
    ended = True  # whether the last line read ended with a newline
    try:
        with open_jsonl(source.paths[0]) as f:
            for lineno, line in enumerate(f, 1):
                ended = line.endswith(b"\n")
                if not line.strip():
                    continue
                default_id = prefix + str(index)
                try:
                    row = _row(reader, line, default_id, index, lineno, batch_file)
                except Exception as e:  # a bug: this row's error record, not the job's end
                    row = faulted(reader, default_id, index, lineno, e)
                batch.append(row)
                index += 1
                first = index == len(batch)  # no batch handed out yet
                if len(batch) >= (reader.first_batch_rows if first else reader.batch_rows):
                    yield batch
                    batch = []
    except READ_ERRORS as e:
        if not ended and batch:  # a line cut short by the damage is part of it
            batch.pop()
            index -= 1
        if batch:
            yield batch
        raise Damaged(index, e) from e
    if batch:
        yield batch


def _row(reader: Reader, line: bytes, default_id: str, index: int, lineno: int, batch_file) -> Row:
    where = f"row {index}, line {lineno}"
    try:
        record = json.loads(line)
    except RecursionError:
        row = Row(default_id, None)
        row.fail(f"{where}: JSON nested too deeply to parse")
    except UnicodeDecodeError as e:
        row = Row(default_id, None)
        row.fail(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})")
    except ValueError as e:
        row = Row(default_id, None)
        row.fail(f"{where}: not valid JSON: {_json_problem(e)}")
    else:
        if not isinstance(record, dict):
            row = Row(default_id, None)
            row.fail(f"{where}: a JSON {_json_kind(record)}, not an object")
        elif batch_file:
            row = _batch_row(reader, record, default_id, where, lineno)
        else:
            row = row_from(reader, record, default_id, where)
    return finished(reader, row, index, lineno)


def is_batch_file(source: Source) -> bool:
    """An OpenAI Batch input file: at least half of its first parsable lines have custom_id and
    body (not only the first: a malformed first request is its own error record, not a reason
    to read the file as prompts)."""
    if source.kind != "jsonl":
        return False
    records = _probe(source.paths[0])
    return bool(records) and 2 * sum(map(is_batch_record, records)) >= len(records)


def _batch_row(reader: Reader, record: dict, default_id: str, where: str, lineno: int) -> Row:
    if not is_batch_record(record):
        # Keep a usable custom_id, so the error line can be matched to its request.
        row_id, bad_id = checked_id(record.get("custom_id"), default_id)
        row = Row(default_id if bad_id else row_id, None)
        row.fail(f"{where}: not an OpenAI batch request (it needs custom_id and body)")
        return row
    row_id, bad_id = checked_id(record["custom_id"], default_id)
    row = batch_row(record, lineno)
    row.id = row_id
    if bad_id is not None:
        row.fail(bad_id.replace("id", "custom_id", 1))
    if reader.keep_columns:
        row.extra = {name: record.get(name) for name in reader.keep_columns}
    return row


def _json_kind(record: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(record), "number")


def _json_problem(e: ValueError) -> str:
    return e.msg if isinstance(e, json.JSONDecodeError) else str(e)


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
