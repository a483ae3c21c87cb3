"""Read rows from the sources in bounded batches, skipping rows already done.

Parquet and saved datasets stream through pyarrow record batches; JSONL is parsed line by line so
that one bad line becomes one error record instead of failing its whole block. Memory stays flat
however large the input: only one batch per source is held at a time.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.errors import UserError
from bulkgen.io.inputs import Source
from bulkgen.io.openai import batch_row, is_batch_record
from bulkgen.row import Row

BATCH_ROWS = 1024
# A JSONL field is taken as missing from the file only if none of its first rows has it.
_JSONL_PROBE_ROWS = 100
# Counting newlines costs a read of the file: do it only up to this size.
_COUNT_JSONL_BYTES = 4 << 30


# Optional input columns that override the job's sampling parameters for their row.
PARAM_COLUMNS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop")


def _overrides(values: dict) -> dict | None:
    given = {k: v for k, v in values.items() if v is not None}
    return given or None


class Reader:
    def __init__(
        self,
        sources: list[Source],
        prompt_column: str,
        id_column: str,
        keep_columns: tuple[str, ...] = (),
        batch_rows: int = BATCH_ROWS,
        template_columns: tuple[str, ...] | None = None,
        messages_column: str = "messages",
    ) -> None:
        self.sources = sources
        self.prompt_column = prompt_column
        self.id_column = id_column
        self.keep_columns = keep_columns
        self.batch_rows = batch_rows
        # With --prompt-template: the columns it uses, put in Row.columns; the prompt column
        # is then optional.
        self.template_columns = template_columns
        # Rows whose prompt is missing or null and that have this column are conversations.
        self.messages_column = messages_column

    def check(self) -> None:
        """Open every source and check its columns, so a bad input fails before any work."""
        for source in self.sources:
            names = self._columns(source)
            if names is None:  # a JSONL file with no parsable row: its rows become errors
                continue
            needed = [] if self.template_columns is not None else [self.prompt_column]
            if self.messages_column in names or _is_batch_file(source):
                needed = []
            for column, flag in [(c, "--prompt-column") for c in needed] + [
                (c, "--keep-columns") for c in self.keep_columns
            ]:
                if column not in names:
                    shown = ", ".join(sorted(names)[:20]) or "none"
                    raise UserError(
                        f"{source.label} has no column {column!r} (its columns: {shown}); "
                        f"name the right one with {flag}"
                    )

    def has_batch_files(self) -> bool:
        """Whether any source is an OpenAI Batch input file (its rows may ask for n, logprobs)."""
        return any(_is_batch_file(source) for source in self.sources)

    def count(self) -> int | None:
        """Total rows in all sources if cheap to know, else None."""
        total = 0
        for source in self.sources:
            n = _with_file_errors(source, lambda s=source: _count(s))
            if n is None:
                return None
            total += n
        return total

    def batches(self, skip: Collection[str] = ()) -> Iterator[list[Row]]:
        """Lists of Rows (at most batch_rows each), leaving out rows whose id is in skip."""
        for source in self.sources:
            read = _read_jsonl if source.kind == "jsonl" else _read_arrow
            rows = read(self, source)
            while True:
                batch = _with_file_errors(source, lambda rows=rows: next(rows, None))
                if batch is None:
                    break
                if skip:
                    batch = [row for row in batch if row.id not in skip]
                if batch:
                    yield batch

    def _columns(self, source: Source) -> set[str] | None:
        if source.kind == "jsonl":
            return _with_file_errors(source, lambda: _jsonl_fields(source.paths[0]))
        return set(_with_file_errors(source, lambda: _arrow_schema(source).names))


def _with_file_errors(source: Source, fn: Callable):
    """fn(), with an unreadable file turned into one clear line."""
    try:
        return fn()
    except (OSError, EOFError, pa.ArrowException, UnicodeDecodeError) as e:
        raise UserError(f"cannot read input {source.label}: {e}") from e


def _open_jsonl(path: Path):
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)


def _jsonl_fields(path: Path) -> set[str] | None:
    fields: set[str] = set()
    parsed = 0
    with _open_jsonl(path) as f:
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


def _read_jsonl(reader: Reader, source: Source) -> Iterator[list[Row]]:
    prompt_col, id_col, keep = reader.prompt_column, reader.id_column, reader.keep_columns
    templated = reader.template_columns
    chat_col = reader.messages_column
    batch_file = _is_batch_file(source)
    prefix = source.name + ":"
    batch: list[Row] = []
    index = 0
    with _open_jsonl(source.paths[0]) as f:
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


def _is_batch_file(source: Source) -> bool:
    """An OpenAI Batch input file: its first parsable line has custom_id and body."""
    if source.kind != "jsonl":
        return False

    def first_record():
        with _open_jsonl(source.paths[0]) as f:
            for line in f:
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        return None

    return is_batch_record(_with_file_errors(source, first_record))


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
    row.overrides = _overrides({name: record.get(name) for name in PARAM_COLUMNS})
    if templated is not None:  # --prompt-template: the template makes the prompt
        row.columns = {name: record[name] for name in templated if name in record}
    elif prompt_col not in record:
        row.fail(f"line {lineno} has no {prompt_col!r} field")
    return row


def _arrow_schema(source: Source) -> pa.Schema:
    if source.kind == "parquet":
        return pq.ParquetFile(source.paths[0]).schema_arrow
    with pa.memory_map(str(source.paths[0])) as f:
        return pa.ipc.open_stream(f).schema


def _record_batches(source: Source, columns: list[str], batch_rows: int):
    if source.kind == "parquet":
        yield from pq.ParquetFile(source.paths[0]).iter_batches(batch_rows, columns=columns)
        return
    for path in source.paths:
        # Memory-mapped: batches are views of the file, not copies.
        with pa.memory_map(str(path)) as f:
            for batch in pa.ipc.open_stream(f):
                for start in range(0, batch.num_rows, batch_rows):
                    yield batch.slice(start, batch_rows).select(columns)


def _read_arrow(reader: Reader, source: Source) -> Iterator[list[Row]]:
    names = _arrow_schema(source).names
    has_id = reader.id_column in names
    params = [name for name in PARAM_COLUMNS if name in names]
    templated = [c for c in reader.template_columns or () if c in names]
    has_prompt = reader.prompt_column in names
    columns = [reader.prompt_column] if has_prompt else []
    columns += [*reader.keep_columns, *params, *templated]
    has_messages = reader.template_columns is None and reader.messages_column in names
    if has_messages:
        columns.append(reader.messages_column)
    if has_id:
        columns.append(reader.id_column)
    columns = list(dict.fromkeys(columns))
    prefix = source.name + ":"
    index = 0
    for batch in _record_batches(source, columns, reader.batch_rows):
        n = batch.num_rows
        prompts = batch.column(reader.prompt_column).to_pylist() if has_prompt else [None] * n
        ids = batch.column(reader.id_column).to_pylist() if has_id else [None] * n
        rows = [
            Row(prefix + str(index + i) if ids[i] is None else str(ids[i]), prompts[i])
            for i in range(n)
        ]
        if reader.keep_columns:
            kept = {name: batch.column(name).to_pylist() for name in reader.keep_columns}
            for i, row in enumerate(rows):
                row.extra = {name: values[i] for name, values in kept.items()}
        if params:
            given = {name: batch.column(name).to_pylist() for name in params}
            for i, row in enumerate(rows):
                row.overrides = _overrides({name: values[i] for name, values in given.items()})
        if reader.template_columns is not None:
            used = {name: batch.column(name).to_pylist() for name in templated}
            for i, row in enumerate(rows):
                row.columns = {name: values[i] for name, values in used.items()}
        if has_messages:
            chats = batch.column(reader.messages_column).to_pylist()
            for row, messages in zip(rows, chats, strict=True):
                if row.prompt is None:
                    row.messages = messages
        index += n
        yield rows


def _count(source: Source) -> int | None:
    if source.kind == "parquet":
        return pq.ParquetFile(source.paths[0]).metadata.num_rows
    if source.kind == "arrow":
        total = 0
        for path in source.paths:
            with pa.memory_map(str(path)) as f:
                total += sum(b.num_rows for b in pa.ipc.open_stream(f))
        return total
    path = source.paths[0]
    if path.name.lower().endswith(".gz") or path.stat().st_size > _COUNT_JSONL_BYTES:
        return None
    return _count_lines(path)


def _count_lines(path: Path) -> int:
    """Non-blank lines. A big file is only scanned for newlines: blank lines there are rare."""
    with open(path, "rb", buffering=1 << 20) as f:
        if path.stat().st_size < 1 << 26:
            return sum(1 for line in f if line.strip())
        count, tail = 0, b"\n"
        while chunk := f.read(1 << 22):
            count += chunk.count(b"\n")
            tail = chunk[-1:]
        return count + (tail != b"\n")
