"""Tabular inputs: Parquet and Arrow files of a saved dataset, read in record batches; CSV and TSV
row by row (csv_rows.py).

Only the columns a job uses are read. CSV and TSV values are all read as text (a type inferred
from the first rows could not hold a later row); their per-row parameter columns are parsed as
numbers, and an empty field is null.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.io.csv_rows import BadRow, Unreadable, csv_header, csv_records
from bulkgen.io.fields import faulted, finished, row_from
from bulkgen.io.inputs import Source
from bulkgen.io.jsonl import READ_ERRORS, Damaged
from bulkgen.row import PARAM_COLUMNS, Row
from bulkgen.structured import without_nulls

if TYPE_CHECKING:
    from bulkgen.io.reader import Reader


_COUNT_CSV_BYTES = 128 << 20  # parsed to count its rows: about 3 s at 50 MB/s (csv_rows.py)


def table_schema(source: Source) -> pa.Schema:
    if source.kind == "parquet":
        return pq.ParquetFile(source.paths[0]).schema_arrow
    if source.kind == "csv":
        return pa.schema([(name, pa.string()) for name in csv_header(source.paths[0])])
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


def _ramped(batches, first_rows: int):
    """The record batches with the first one's leading first_rows rows handed out alone."""
    batch = next(batches, None)
    if batch is None:
        return
    if batch.num_rows > first_rows:
        yield batch.slice(0, first_rows)
        batch = batch.slice(first_rows)
    yield batch
    yield from batches


def read_table(reader: Reader, source: Source) -> Iterator[list[Row]]:
    schema = table_schema(source)
    used = [reader.id_column, reader.prompt_column, *reader.keep_columns, *PARAM_COLUMNS]
    used += reader.template_columns or ()
    if reader.template_columns is None:
        used.append(reader.messages_column)
    columns = [name for name in dict.fromkeys(used) if name in schema.names]
    types = reader.keep_types or {}
    # (a CSV with no header, an empty file say, has no columns and no rows)
    kept = [n for n in reader.keep_columns if n in schema.names]
    trusted = frozenset(n for n in kept if schema.field(n).type == types.get(n))
    if source.kind == "csv":
        yield from _read_csv(reader, source, columns, trusted)
        return
    prefix = source.name + ":"
    index = 0
    batches = _ramped(_record_batches(source, columns, reader.batch_rows), reader.first_batch_rows)
    while True:
        try:
            batch = next(batches, None)
        except (OSError, EOFError, pa.ArrowException) as e:
            raise Damaged(index, e) from e
        if batch is None:
            return
        values = {name: _pylist(batch.column(name)) for name in columns}
        format_type = schema.field("response_format").type if "response_format" in values else None
        if format_type is not None and pa.types.is_struct(format_type):  # every row's keys in
            # every row, the missing ones null: not the row's (structured.without_nulls)
            values["response_format"] = list(map(without_nulls, values["response_format"]))
        rows = []
        for i in range(batch.num_rows):
            default_id = prefix + str(index)
            try:
                record = {name: column[i] for name, column in values.items()}
                row = _row(reader, source, record, default_id, index, trusted)
            except Exception as e:  # a bug: this row's error record, not the job's end
                row = faulted(reader, default_id, index, 0, e)
            rows.append(row)
            index += 1
        yield rows


def _read_csv(reader: Reader, source: Source, columns: list[str], trusted) -> Iterator[list[Row]]:
    prefix = source.name + ":"
    rows: list[Row] = []
    index = 0
    try:
        for record, line in csv_records(source.paths[0], columns):
            default_id = prefix + str(index)
            try:
                if isinstance(record, BadRow):
                    row = Row(default_id, None)
                    row.fail(f"row {index}: {record.reason}")
                    row = finished(reader, row, index, line)
                else:
                    row = _row(reader, source, record, default_id, index, trusted, line)
            except Exception as e:  # a bug: this row's error record, not the job's end
                row = faulted(reader, default_id, index, line, e)
            rows.append(row)
            index += 1
            if len(rows) >= (reader.first_batch_rows if index == len(rows) else reader.batch_rows):
                yield rows
                rows = []
    except READ_ERRORS as e:
        if rows:
            yield rows
        raise Damaged(index, e) from e
    if rows:
        yield rows


def _row(reader, source, record: dict, default_id: str, index: int, trusted, line=0) -> Row:
    bad = [name for name, value in record.items() if isinstance(value, Unreadable)]
    for name in bad:
        reason, record[name] = record[name].reason, None
    params = None
    if source.kind == "csv":  # parameters parsed as numbers; kept and template columns as text
        params = {name: record.get(name) for name in PARAM_COLUMNS}
        for name, value in params.items():
            if name not in ("stop", "response_format") and isinstance(value, str):
                params[name] = _number(value)
    row = row_from(reader, record, default_id, f"row {index}", params)
    if bad and row.error is None:
        row.fail(f"column {bad[0]!r} cannot be read ({reason})")
    return finished(reader, row, index, line, trusted)


def _pylist(column: pa.Array) -> list:
    """The column's values; a value that cannot be converted is Unreadable, not the batch's end."""
    try:
        return column.to_pylist()
    except Exception:
        values = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
            except Exception as e:
                values.append(Unreadable(f"{type(e).__name__}: {e}"))
        return values


def _number(text: str) -> object:
    """A CSV parameter's text as an int or float; left as text (an error later) if neither."""
    for parse in (int, float):
        try:
            return parse(text.strip())
        except ValueError:
            continue
    return text


def count_rows(source: Source) -> int | None:
    if source.kind == "parquet":
        return pq.ParquetFile(source.paths[0]).metadata.num_rows
    if source.kind == "arrow":
        total = 0
        for path in source.paths:
            with pa.memory_map(str(path)) as f:
                total += sum(b.num_rows for b in pa.ipc.open_stream(f))
        return total
    path = source.paths[0]
    if path.name.lower().endswith(".gz") or path.stat().st_size > _COUNT_CSV_BYTES:
        return None  # a line count would be wrong (quoted newlines); a parse would take long
    return sum(1 for _ in csv_records(path, []))
