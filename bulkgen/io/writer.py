"""Shards: rows buffered until a shard is full, then written whole, synced and renamed into place.

A shard is first written as `.part-NNNNN.<fmt>.tmp`, fsynced, renamed to `part-NNNNN.<fmt>` and
the folder fsynced, so after a crash a `part-*` file is either complete or absent.

With --format openai a shard line is a whole input row: the samples of a row are held back until
all of them have arrived, then written as the choices of one line (a row is done or not done).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.io.fence import Fenced
from bulkgen.io.job import TEMP_PREFIX, fsync_dir, output_error, remove_quietly, shard_name
from bulkgen.io.openai import output_line
from bulkgen.row import Row
from bulkgen.run_config import OUTPUT_COLUMNS

_SCHEMA = pa.schema(
    [(name, pa.string()) for name in OUTPUT_COLUMNS[:5]]
    + [("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())]
)
_TOP_LOGPROB = pa.struct(
    [("token_id", pa.int64()), ("token", pa.string()), ("logprob", pa.float64())]
)


class ShardWriter:
    def __init__(
        self,
        out: Path,
        fmt: str,
        shard_size: int,
        first_index: int = 0,
        keep_columns: tuple[str, ...] = (),
        samples: bool = False,
        logprobs: bool = False,
        model: str = "",
        prefix: str = "",
        fence: Callable[[], None] | None = None,
        token_ids: bool = False,
    ) -> None:
        """samples: write a `sample` column; logprobs: `logprobs` and `top_logprobs` columns;
        model: the model name of --format openai lines; prefix: in shard names after `part-`
        (a data-parallel worker's `wII-aAA-`); fence: called before a shard is made final,
        raises io.fence.Fenced if a newer attempt of this worker exists."""
        self.prefix = prefix
        self.fence = fence
        self.token_ids = token_ids  # a token_ids column (--output-token-ids)
        self.out = Path(out)
        self.fmt = fmt
        self.samples = samples
        self.logprobs = logprobs
        self.model = model
        self._created = int(time.time())
        self._groups: dict[int, list[Row]] = {}  # --format openai: a row's samples so far
        self.shard_size = shard_size
        self.keep_columns = keep_columns
        self.next_index = first_index
        self.shards: list[str] = []
        self._buffer: list[Row] = []
        # A kept column's type is fixed by the first shard that has a value in it, so that all
        # shards of a job share one schema.
        self._keep_types: dict[str, pa.DataType] = {}

    def add(self, rows: list[Row]) -> None:
        if self.fmt == "openai":
            rows = self._whole_groups(rows)
        self._buffer.extend(rows)
        while len(self._buffer) >= self.shard_size:
            self._write(self._buffer[: self.shard_size])
            del self._buffer[: self.shard_size]

    def _whole_groups(self, rows: list[Row]) -> list:
        """The rows whose samples have now all arrived, each as the list of its samples."""
        whole = []
        for row in rows:
            group = self._groups.setdefault(row.group, [])
            group.append(row)
            if len(group) == row.group_size:
                whole.append(self._groups.pop(row.group))
        return whole

    def flush(self) -> None:
        """Write the buffered rows as a last, shorter shard (rows missing samples are not
        written with --format openai: a rerun generates them whole)."""
        if self._buffer:
            self._write(self._buffer)
            self._buffer = []

    def _write(self, rows: list[Row]) -> None:
        fmt = "jsonl" if self.fmt == "openai" else self.fmt
        name = shard_name(self.next_index, fmt, self.prefix)
        tmp = self.out / f"{TEMP_PREFIX}{name[len('part-') :]}.tmp"
        data = None if self.fmt == "parquet" else self._encode(rows)
        table = self._table(rows) if data is None else None
        try:
            with open(tmp, "wb") as f:
                if table is not None:
                    pq.write_table(table, f, compression="zstd")
                else:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if self.fence is not None:
                try:
                    self.fence()
                except Fenced:
                    remove_quietly(tmp)
                    raise
            os.replace(tmp, self.out / name)
            fsync_dir(self.out)
        except OSError as e:  # a full disk, an I/O error, the folder removed or read-only
            remove_quietly(tmp)
            raise output_error(self.out, f"write shard {name}", e) from None
        self.shards.append(name)
        self.next_index += 1

    def _encode(self, rows: list) -> bytes:
        return self._openai(rows) if self.fmt == "openai" else self._jsonl(rows)

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
        if self.samples:
            columns.append(pa.array([r.sample for r in rows], pa.int64()))
            names.append("sample")
        if self.logprobs:
            columns.append(pa.array([r.logprobs for r in rows], pa.list_(pa.float64())))
            top = [r.top_logprobs for r in rows]
            columns.append(pa.array(top, pa.list_(pa.list_(_TOP_LOGPROB))))
            names += ["logprobs", "top_logprobs"]
        if self.token_ids:
            columns.append(pa.array([r.token_ids for r in rows], pa.list_(pa.int64())))
            names.append("token_ids")
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
            if self.samples:
                record["sample"] = r.sample
            if self.logprobs:
                record["logprobs"], record["top_logprobs"] = r.logprobs, r.top_logprobs
            if self.token_ids:
                record["token_ids"] = r.token_ids
            for name in self.keep_columns:
                record[name] = r.extra.get(name) if r.extra else None
            lines.append(json.dumps(record, ensure_ascii=False, default=str))
        lines.append("")
        return "\n".join(lines).encode()

    def _openai(self, groups: list[list[Row]]) -> bytes:
        lines = [output_line(g, self.model, self._created, self.token_ids) for g in groups]
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
