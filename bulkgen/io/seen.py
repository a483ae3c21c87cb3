"""Repeated ids, found while reading: a row whose id an earlier row has is an error record.

Memory is bounded by the number of distinct ids, not their length: each id is kept as an 8-byte
blake2b hash (a Python int) mapping to where it was first seen (one int). Two different ids
share a hash with probability about n**2 / 2**65 (3e-6 for ten million ids); the later one would
be reported as a duplicate.

A duplicate's error record gets the row's own default id `<file>:<row>`, never the repeated id:
so the first occurrence alone owns its id, and resume (which skips ids in complete shards) can
neither skip the first occurrence because of its duplicate nor generate a duplicate. Every run
reads every row through this check before anything is skipped, so a rerun finds the same
duplicates as the first run. A later row whose own id is such a record's is an error record too,
saying so (the record's id is already written; resume could not tell the two apart), and a row
that failed as it was read (a bad line: its id is its default one) keeps its own error when
another row has that id.
"""

from __future__ import annotations

import hashlib

from bulkgen.io.inputs import Source
from bulkgen.io.validate import as_record, shown
from bulkgen.row import Row

_LINE_BITS = _INDEX_BITS = 48


class FirstSeen:
    def __init__(self, sources: list[Source]) -> None:
        self.sources = sources
        self._first: dict[int, int] = {}  # hash of an id -> where it was first seen (packed)
        self._records: set[int] = set()  # hashes of the ids given to duplicates' records

    def check(self, row: Row, source_number: int) -> None:
        """Turn the row into a duplicate's error record if its id was seen before."""
        where = (source_number << (_INDEX_BITS + _LINE_BITS)) | (row.index << _LINE_BITS) | row.line
        key = _key(row.id)
        first = self._first.setdefault(key, where)
        if first == where:
            return
        # A row failed as read (its default id another row has) keeps its own error.
        if row.error is None and key in self._records:  # a duplicate's record took the id
            row.fail(
                f"id {shown(row.id)} is the id of the error record written for the repeated id at "
                f"{self._describe(first)}: give this row another id"
            )
        elif row.error is None:
            row.fail(f"duplicate id {shown(row.id)} (first at {self._describe(first)})")
        as_record(row)
        name, suffix = self.sources[source_number].name, ""
        while (key := _key(f"{name}:{row.index}{suffix}")) in self._first:
            suffix += "~"  # its default id is some other row's id too
        row.id = f"{name}:{row.index}{suffix}"
        self._first[key] = where
        self._records.add(key)

    def _describe(self, where: int) -> str:
        source = self.sources[where >> (_INDEX_BITS + _LINE_BITS)]
        index = (where >> _LINE_BITS) & ((1 << _INDEX_BITS) - 1)
        line = where & ((1 << _LINE_BITS) - 1)
        return f"{source.label} row {index}" + (f", line {line}" if line else "")


def _key(row_id: str) -> int:
    digest = hashlib.blake2b(row_id.encode("utf-8", "backslashreplace"), digest_size=8).digest()
    return int.from_bytes(digest, "little")
