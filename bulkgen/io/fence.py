"""Fenced retries of data-parallel workers: attempts, the fence, and duplicates dropped.

A restarted Ray actor (or any rerun of a worker) is a new attempt of that worker. Each attempt
claims a number by creating `.attempt-wII-AA` with O_EXCL (two attempts racing get different
numbers) and names its shards after it, `part-wII-aAA-NNNNN`, so an old attempt still running on
a partitioned node never writes a name the new one uses: nothing is overwritten silently.

The fence: a worker makes a shard final (renames it into place) only while its attempt is the
newest of its worker; an old attempt that finds a newer one discards its shard and stops. Between
that check and the rename a shard can still slip in (the check is not atomic with the rename on a
shared filesystem), so the driver, holding the folder's lock with no worker running (at the
start and at the end of a job), drops the rows that two final shards both hold: the copy in the
shard that sorts first (the older attempt's) stays, the later shard is rewritten without it (or
deleted when nothing is left). Every row then is in exactly one shard.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bulkgen.errors import UserError
from bulkgen.io.openai import is_output_line

ATTEMPT_PREFIX = ".attempt-"
_ATTEMPT = re.compile(r"\.attempt-w(\d+)-(\d+)")


class Fenced(UserError):
    """A newer attempt of this worker exists: this one must not make shards final."""


def attempts(folder: Path, worker: int) -> list[int]:
    """The attempt numbers claimed for a worker in this folder."""
    found = []
    for path in folder.glob(f"{ATTEMPT_PREFIX}w{worker:02d}-*"):
        match = _ATTEMPT.fullmatch(path.name)
        if match and int(match[1]) == worker:
            found.append(int(match[2]))
    return found


def claim_attempt(folder: Path, worker: int) -> int:
    """A new attempt number for the worker, newer than any claimed before (O_EXCL: unique)."""
    number = max(attempts(folder, worker), default=-1) + 1
    while True:
        path = folder / f"{ATTEMPT_PREFIX}w{worker:02d}-{number:02d}"
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return number
        except FileExistsError:
            number += 1


def is_current(folder: Path, worker: int, attempt: int) -> bool:
    return max(attempts(folder, worker), default=attempt) <= attempt


def drop_duplicates(shards: list[Path]) -> int:
    """Keep each row (id, sample) in the first shard holding it; rewrite or delete the later
    shards that hold it again. Returns the number of rows dropped. Only with no writer running."""
    seen: set = set()
    dropped = 0
    for path in sorted(shards, key=lambda p: p.name):
        keys = _keys(path)
        repeated = [k in seen for k in keys]
        seen.update(keys)
        if any(repeated):
            _rewrite_without(path, repeated)
            dropped += sum(repeated)
    return dropped


def _keys(path: Path) -> list:
    if path.suffix == ".parquet":
        names = pq.read_schema(path).names
        table = pq.read_table(path, columns=["id"] + (["sample"] if "sample" in names else []))
        ids = table.column("id").to_pylist()
        if "sample" not in names:
            return [(i, 0) for i in ids]
        return list(zip(ids, table.column("sample").to_pylist(), strict=True))
    return [_line_key(line) for line in _lines(path)]


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def _line_key(line: bytes) -> tuple:
    record = json.loads(line)
    if is_output_line(record):  # an OpenAI Batch output line is a whole row, all its samples
        return (record["custom_id"], None)
    return (record["id"], record.get("sample") or 0)


def _rewrite_without(path: Path, repeated: list[bool]) -> None:
    if all(repeated):
        path.unlink()
        return
    tmp = path.with_name(f".part-dedup-{path.name}.tmp")  # TEMP_PREFIX: a crash leaves no debris
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        table = table.filter(pc.invert(pa.array(repeated, pa.bool_())))
        pq.write_table(table, tmp, compression="zstd")
    else:
        kept = [line for line, r in zip(_lines(path), repeated, strict=True) if not r]
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
