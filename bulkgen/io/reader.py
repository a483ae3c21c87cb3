"""Read rows from the sources in bounded batches, skipping rows already done.

Parquet and saved datasets stream through pyarrow record batches; JSONL is parsed line by line so
that one bad line becomes one error record instead of failing its whole block. Memory stays flat
however large the input: only one batch per source is held at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.errors import UserError
from bulkgen.io.inputs import Source
from bulkgen.io.jsonl import count_lines, is_batch_file, jsonl_fields, read_jsonl
from bulkgen.row import PARAM_COLUMNS, Row, param_overrides

BATCH_ROWS = 1024
# Counting newlines costs a read of the file: do it only up to this size.
_COUNT_JSONL_BYTES = 4 << 30


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
            if self.messages_column in names or self._is_batch_file(source):
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
        return any(self._is_batch_file(source) for source in self.sources)

    @staticmethod
    def _is_batch_file(source: Source) -> bool:
        return _with_file_errors(source, lambda: is_batch_file(source))

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
            read = read_jsonl if source.kind == "jsonl" else _read_arrow
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
            return _with_file_errors(source, lambda: jsonl_fields(source.paths[0]))
        return set(_with_file_errors(source, lambda: _arrow_schema(source).names))


def _with_file_errors(source: Source, fn: Callable):
    """fn(), with an unreadable file turned into one clear line."""
    try:
        return fn()
    except (OSError, EOFError, pa.ArrowException, UnicodeDecodeError) as e:
        raise UserError(f"cannot read input {source.label}: {e}") from e


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
                row.overrides = param_overrides({name: values[i] for name, values in given.items()})
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
    return count_lines(path)
