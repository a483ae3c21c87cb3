"""Shards: rows buffered until a shard is full, then written whole, synced and renamed into place.

A shard is first written as `.part-NNNNN.<fmt>.tmp`, fsynced, renamed to `part-NNNNN.<fmt>` and
the folder fsynced, so after a crash a `part-*` file is either complete or absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.io.job import TEMP_PREFIX, fsync_dir, shard_name
from bulkgen.row import Row
from bulkgen.run_config import OUTPUT_COLUMNS

_SCHEMA = pa.schema(
    [(name, pa.string()) for name in OUTPUT_COLUMNS[:5]]
    + [("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())]
)


class ShardWriter:
    def __init__(
        self,
        out: Path,
        fmt: str,
        shard_size: int,
        first_index: int = 0,
        keep_columns: tuple[str, ...] = (),
    ) -> None:
        self.out = Path(out)
        self.fmt = fmt
        self.shard_size = shard_size
        self.keep_columns = keep_columns
        self.next_index = first_index
        self.shards: list[str] = []
        self._buffer: list[Row] = []
        # A kept column's type is fixed by the first shard that has a value in it, so that all
        # shards of a job share one schema.
        self._keep_types: dict[str, pa.DataType] = {}

    def add(self, rows: list[Row]) -> None:
        self._buffer.extend(rows)
        while len(self._buffer) >= self.shard_size:
            self._write(self._buffer[: self.shard_size])
            del self._buffer[: self.shard_size]

    def flush(self) -> None:
        """Write the buffered rows as a last, shorter shard."""
        if self._buffer:
            self._write(self._buffer)
            self._buffer = []

    def _write(self, rows: list[Row]) -> None:
        name = shard_name(self.next_index, self.fmt)
        tmp = self.out / f"{TEMP_PREFIX}{name[len('part-') :]}.tmp"
        with open(tmp, "wb") as f:
            if self.fmt == "parquet":
                pq.write_table(self._table(rows), f, compression="zstd")
            else:
                f.write(self._jsonl(rows))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.out / name)
        fsync_dir(self.out)
        self.shards.append(name)
        self.next_index += 1

    def _table(self, rows: list[Row]) -> pa.Table:
        columns = [
            pa.array([r.id for r in rows], pa.string()),
            pa.array([r.prompt_text for r in rows], pa.string()),
            pa.array([r.text for r in rows], pa.string()),
            pa.array([r.finish_reason for r in rows], pa.string()),
            pa.array([r.error for r in rows], pa.string()),
            pa.array([r.prompt_tokens for r in rows], pa.int64()),
            pa.array([r.completion_tokens for r in rows], pa.int64()),
        ]
        names = list(_SCHEMA.names)
        for name in self.keep_columns:
            columns.append(self._kept(name, [r.extra.get(name) if r.extra else None for r in rows]))
            names.append(name)
        return pa.Table.from_arrays(columns, names=names)

    def _kept(self, name: str, values: list) -> pa.Array:
        known = self._keep_types.get(name)
        try:
            array = pa.array(values, known)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            # Mixed types in one column (JSONL allows it): keep each value as JSON text.
            known = self._keep_types[name] = pa.string()
            array = pa.array([None if v is None else json.dumps(v, default=str) for v in values])
        if known is None and array.type != pa.null():
            self._keep_types[name] = array.type
        return array

    def _jsonl(self, rows: list[Row]) -> bytes:
        lines = []
        for r in rows:
            record = {
                "id": r.id,
                "prompt": r.prompt_text,
                "text": r.text,
                "finish_reason": r.finish_reason,
                "error": r.error,
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
            }
            for name in self.keep_columns:
                record[name] = r.extra.get(name) if r.extra else None
            lines.append(json.dumps(record, ensure_ascii=False, default=str))
        lines.append("")
        return "\n".join(lines).encode()
