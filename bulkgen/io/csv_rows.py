"""CSV and TSV rows, read one at a time with Python's csv module, so that a bad row is that row's
error record at its own row number and line, and the rows around it are read as usual.

Quoting is RFC 4180's, as pandas reads it (TSV too): a quoted value may hold delimiters, doubled
quotes and newlines. A bad row is one with more or fewer fields than the header, a value that is
not UTF-8, or a quote that opens a value and does not close it properly. On one line such a row
is read leniently as before (`"Hello" she said` gives `Hello she said`); over several lines it
is an unbalanced quote that swallowed the lines after it, and the error record names them (they
are not rows of their own until the quote is fixed). Blank lines are skipped; an empty value is
null.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path

_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # the bytes surrogateescape kept of invalid UTF-8


class Unreadable:
    """A value that cannot be converted to text (invalid UTF-8, say)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class BadRow:
    """A row that could not be split into the header's fields."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _open(path: Path) -> io.TextIOBase:
    # utf-8-sig drops a byte order mark; newline="" leaves quoted newlines to the csv module.
    options = dict(encoding="utf-8-sig", errors="surrogateescape", newline="")
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", **options)
    return open(path, **options, buffering=1 << 20)


def _dialect(path: Path) -> dict:
    tsv = path.name.lower().removesuffix(".gz").endswith(".tsv")
    # No limit on a value's length (the module's default is 128 KiB, a long prompt's size).
    csv.field_size_limit(sys.maxsize)
    return dict(delimiter="\t" if tsv else ",", strict=True)


def csv_header(path: Path) -> list[str]:
    """The column names: the first row that is not blank (empty for an empty file)."""
    with _open(path) as f:
        for fields in csv.reader(f, **{**_dialect(path), "strict": False}):
            if fields:
                return fields
    return []


def csv_records(path: Path, columns: list[str]) -> Iterator[tuple[dict | BadRow, int]]:
    """Each row after the header as {column: value} of the named columns (or a BadRow), with the
    line it starts on. A value is text, None (empty) or Unreadable."""
    dialect = _dialect(path)
    with _open(path) as f:
        raw: list[str] = []  # the physical lines of the row being read

        def lines():
            for line in f:
                raw.append(line)
                yield line

        rows = csv.reader(lines(), **dialect)
        header: list[str] | None = None
        while True:
            raw.clear()
            start = rows.line_num + 1
            try:
                fields = next(rows)
            except StopIteration:
                return
            except csv.Error as e:
                if len(raw) > 1:
                    yield _unbalanced(start, rows.line_num, e), start
                    continue
                fields = next(csv.reader(raw, **{**dialect, "strict": False}), [])
            if not fields:
                continue  # a blank line
            if header is None:
                header = fields
                where = {name: header.index(name) for name in columns if name in header}
                continue
            if len(fields) != len(header):
                reason = f"line {start} has {len(fields)} fields where the header has {len(header)}"
                yield BadRow(reason), start
                continue
            yield {name: _value(fields[i]) for name, i in where.items()}, start


def _unbalanced(start: int, end: int, e: csv.Error) -> BadRow:
    return BadRow(
        f"an unbalanced quote: the value opened on line {start} runs on to line {end} ({e}), "
        f"so lines {start + 1}-{end} are read as part of it, not as rows: close or double the "
        "quote"
    )


def _value(text: str) -> str | Unreadable | None:
    if not text:
        return None
    if _NOT_UTF8.search(text):
        return Unreadable("not valid UTF-8")
    return text
