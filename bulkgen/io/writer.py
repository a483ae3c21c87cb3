"""Shards: rows buffered until a shard is full, then written whole, synced and renamed into place.

A shard is first written as `.part-NNNNN.<fmt>.tmp`, fsynced, renamed to `part-NNNNN.<fmt>` and
the folder fsynced, so after a crash a `part-*` file is either complete or absent.

With --format openai a shard line is a whole input row: the samples of a row are held back until
all of them have arrived, then written as the choices of one line (a row is done or not done).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.guard import fault
from bulkgen.io.fence import Fenced
from bulkgen.io.job import TEMP_PREFIX, fsync_dir, output_error, remove_quietly, shard_name
from bulkgen.io.json_line import json_line
from bulkgen.io.openai import TokenBytes, output_line
from bulkgen.io.schema import kept_array
from bulkgen.io.validate import writable
from bulkgen.row import Row
from bulkgen.run_config import OUTPUT_COLUMNS

_SCHEMA = pa.schema(
    [(name, pa.string()) for name in OUTPUT_COLUMNS[:5]]
    + [("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())]
)
_TOP_LOGPROB = pa.struct(
    [("token_id", pa.int64()), ("token", pa.string()), ("logprob", pa.float64())]
)
_F64 = pa.float64()
_LOGPROBS = pa.list_(_F64)
_TOP_LOGPROBS = pa.list_(pa.list_(_TOP_LOGPROB))


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
        keep_types: dict[str, pa.DataType] | None = None,
        final: Callable[[list[Row]], None] | None = None,
        token_bytes: TokenBytes | None = None,
    ) -> None:
        """samples: write a `sample` column; logprobs: `logprobs` and `top_logprobs` columns;
        model: the model name of --format openai lines; prefix: in shard names after `part-`
        (a data-parallel worker's `wII-aAA-`); fence: called before a shard is made final,
        raises io.fence.Fenced if a newer attempt of this worker exists; keep_types: the job's
        kept-column types (see io/schema.py), which every shard uses; final: called with a
        shard's rows once it is final (a data-parallel worker tells its parent); token_bytes:
        each logprob token's bytes in --format openai lines (text/token_bytes.py)."""
        self.prefix = prefix
        self.fence = fence
        self.final = final
        self.token_ids = token_ids  # a token_ids column (--output-token-ids)
        self.token_bytes = token_bytes
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
        self.keep_types = keep_types or {}
        self.faults = 0  # rows that could not be written as they were (a bug): error records
        # pyarrow's first conversion from Python imports its pandas shim, holding the GIL for
        # 0.2 s (measured): take it here, before rows flow, not at the first shard while the
        # engine thread runs.
        pa.array([], pa.int64())

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
        encode = {"parquet": self._table, "openai": self._openai}.get(self.fmt, self._jsonl)
        content = self._encoded(encode, rows)
        try:
            with open(tmp, "wb") as f:
                if self.fmt == "parquet":
                    pq.write_table(content, f, compression="zstd")
                else:
                    f.write(content)
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
        if self.final is not None:  # --format openai: an item is a row's samples
            self.final([r for item in rows for r in (item if isinstance(item, list) else [item])])

    def _encoded(self, encode, rows: list):
        """encode(rows); a row that cannot be encoded becomes an error record (a row fault)."""
        try:
            return encode(rows)
        except Exception:
            pass
        for item in rows:
            try:
                encode([item])
            except Exception as e:
                for row in item if isinstance(item, list) else [item]:  # openai: a row's samples
                    self.faults += 1
                    fault(row, f"writing this row failed: {type(e).__name__}: {e}")
                    row.id, row.prompt_text = writable(row.id), writable(row.prompt_text)
                    row.extra = None
        return encode(rows)

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
            columns += logprob_columns(rows)
            names += ["logprobs", "top_logprobs"]
        if self.token_ids:
            columns.append(pa.array([r.token_ids for r in rows], pa.list_(pa.int64())))
            names.append("token_ids")
        for name in self.keep_columns:
            columns.append(self._kept(name, [r.extra.get(name) if r.extra else None for r in rows]))
            names.append(name)
        return pa.Table.from_arrays(columns, names=names)

    def _kept(self, name: str, values: list) -> pa.Array:
        return kept_array(values, self.keep_types.get(name))

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
                lp = r.token_logprobs
                record["logprobs"] = lp.chosen.tolist() if lp is not None else None
                record["top_logprobs"] = r.top_dicts() if r.top_texts is not None else None
            if self.token_ids:
                record["token_ids"] = r.token_ids
            for name in self.keep_columns:
                record[name] = r.extra.get(name) if r.extra else None
            lines.append(json_line(record))
        lines.append("")
        return "\n".join(lines).encode()

    def _openai(self, groups: list[list[Row]]) -> bytes:
        lines = [
            output_line(g, self.model, self._created, self.token_ids, self.token_bytes)
            for g in groups
        ]
        return "".join(json_line(line) + "\n" for line in lines).encode()


def logprob_columns(rows: list[Row]) -> list[pa.Array]:
    """The `logprobs` and `top_logprobs` columns (null where a row has none, or top_logprobs
    where its tokens are not named), assembled from each row's flat arrays and list offsets: no
    Python object per entry but the texts.

    Each row's values are converted by their own pyarrow calls and the pieces concatenated: one
    conversion of a whole shard's texts (millions at 1,000 rows x 500 tokens x top 5) holds the
    interpreter (the GIL) for its whole length, and stalled the engine thread for up to 0.5 s on a
    2-core CPU (scripts/bench_logprobs.py); between per-row calls the engine thread gets it back
    within the switch interval."""
    positions, with_lp, named = [], [], []  # per row
    chosen, ids, texts, values = [], [], [], []  # per row with logprobs / named top entries
    widths, named_positions = [], []  # per named row: k, and its positions
    for r in rows:
        lp = r.token_logprobs
        positions.append(len(lp) if lp is not None else 0)
        with_lp.append(lp is not None)
        named.append(lp is not None and r.top_texts is not None)
        if lp is not None:
            chosen.append(lp.chosen)
        if named[-1]:
            ids.append(lp.top_ids)
            texts.append(r.top_texts)
            values.append(lp.top_logprobs)
            widths.append(lp.k)
            named_positions.append(len(lp))
    entries = pa.StructArray.from_arrays(
        [_concat(ids, pa.int64()), _concat(texts, pa.string()), _concat(values, _F64)],
        fields=list(_TOP_LOGPROB),
    )
    per_position = pa.ListArray.from_arrays(
        _offsets(np.repeat(np.array(widths, np.int64), named_positions)), entries
    )
    top = pa.ListArray.from_arrays(
        _offsets(np.multiply(positions, named)),
        per_position,
        _TOP_LOGPROBS,
        mask=pa.array(np.logical_not(named)),
    )
    logprobs = pa.ListArray.from_arrays(
        _offsets(positions),
        _concat(chosen, _F64),
        _LOGPROBS,
        mask=pa.array(np.logical_not(with_lp)),
    )
    return [logprobs, top]


def _offsets(lengths) -> pa.Array:
    """List offsets (int32) of consecutive lists of these lengths."""
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def _concat(pieces: list, kind: pa.DataType) -> pa.Array:
    """One array of the pieces' values, each piece (a numpy array or a list) converted alone."""
    if not pieces:
        return pa.array([], kind)
    return pa.concat_arrays([pa.array(p, kind) for p in pieces])
