"""Input fingerprints: what job.json records of each input file, to notice a changed input.

A fingerprint is the file's size, modification time and a blake2b hash of its first and last MiB
(so it costs at most 2 MiB of reading per file, whatever its size). A rerun whose inputs changed
(default ids `<file>:<row>` shift when rows are inserted) is refused unless --overwrite starts
over or --allow-changed-input resumes anyway, keyed by id. New input files are not a change:
they add rows to the job.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from bulkgen.errors import UserError
from bulkgen.io.inputs import Source

_EDGE_BYTES = 1 << 20
_CONTENT = ("size", "mtime_ns", "edges")


def fingerprints(sources: list[Source]) -> dict[str, dict]:
    """Resolved path -> {size, mtime_ns, edges, source} of every file of the sources; source is
    the name that prefixes its rows' default ids."""
    return {
        str(p.resolve()): {**_fingerprint(p), "source": s.name} for s in sources for p in s.paths
    }


def _fingerprint(path: Path) -> dict:
    try:
        stat = path.stat()
        digest = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as f:
            digest.update(f.read(_EDGE_BYTES))
            if stat.st_size > _EDGE_BYTES:
                f.seek(max(_EDGE_BYTES, stat.st_size - _EDGE_BYTES), os.SEEK_SET)
                digest.update(f.read(_EDGE_BYTES))
    except OSError as e:
        raise UserError(f"cannot read input {path}: {e.strerror or e}") from e
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "edges": digest.hexdigest()}


def check_unchanged(recorded: dict | None, current: dict[str, dict], out: Path) -> None:
    """A UserError naming the first input that changed since job.json recorded it."""
    for path, now in current.items():
        before = (recorded or {}).get(path)
        if before is None:
            continue
        what = [k for k in _CONTENT if before.get(k) != now[k]]
        if not what:
            continue
        raise UserError(
            f"input {path} changed since the job in {out} started ({', '.join(what)} differ): "
            "pass --overwrite to start over, or --allow-changed-input to resume anyway "
            "(rows are matched by id; default ids <file>:<row> shift if rows moved)"
        )


def check_same_names(recorded: dict | None, current: dict[str, dict], out: Path) -> None:
    """A UserError if a file the job read before is named otherwise now (INPUT spelled another
    way: the folder then, the file now): its rows' default ids would change and every row be
    generated again. Job folders of older versions did not record names."""
    for path, now in current.items():
        before = (recorded or {}).get(path, {}).get("source")
        if before is not None and before != now["source"]:
            raise UserError(
                f"input {path} gave the job in {out} rows with ids '{before}:<row>', and as "
                f"named now it gives '{now['source']}:<row>', so its rows would be generated "
                "again: pass INPUT as the first run did (or --overwrite to start over)"
            )
