"""The output folder of a job: its recorded settings, what is already done, and its lock.

Only complete shards count: a shard is written under a temporary name and renamed into place, so
`part-*` files are whole, and their ids are exactly the rows done. A rerun skips those rows;
stray temporary files from a killed run are deleted. The settings that shape the outputs must
match on a rerun; the input list is recorded but may change (new files add rows to the job).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.errors import UserError
from bulkgen.io.done import Done
from bulkgen.io.fence import ATTEMPT_PREFIX
from bulkgen.io.fingerprint import check_same_names, check_unchanged
from bulkgen.io.model_revision import check_same_revision
from bulkgen.io.shard_summary import read_summary
from bulkgen.run_config import settings_differences

SETTINGS_FILE = "job.json"
STATS_FILE = "stats.json"
LOCK_FILE = ".lock"
TEMP_PREFIX = ".part-"  # a shard being written; never matches part-*
# part-NNNNN, or part-wII-aAA-NNNNN: a data-parallel worker's attempt's own numbering
# (bulkgen/parallel.py, io/fence.py); part-wII-NNNNN from before attempts were named.
_SHARD = re.compile(r"part-((?:w\d+-(?:a\d+-)?)?)(\d+)\.(parquet|jsonl)")


class OutputError(UserError):
    """The output folder cannot be written (a full disk, an I/O error, the folder removed or
    made read-only): the job stops in one line; complete shards stay for a rerun."""


def output_error(folder: Path, what: str, error: OSError) -> OutputError:
    cause = error.strerror or str(error)
    if error.errno is not None and error.errno in errno.errorcode:
        cause += f" ({errno.errorcode[error.errno]})"
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = "free space" if full else "fix the folder (or choose another --out)"
    return OutputError(
        f"cannot {what} in {folder}: {cause}; {fix}, then rerun the same command (complete "
        "shards, if any, are kept and resumed after)"
    )


def remove_quietly(path: Path) -> None:
    """Remove a temporary file, if the folder still allows it (it may be gone or read-only)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def shard_name(index: int, fmt: str, prefix: str = "") -> str:
    return f"part-{prefix}{index:05d}.{fmt}"


class JobDir:
    def __init__(self, out: str | Path) -> None:
        self.path = Path(out)
        self._lock_fd: int | None = None
        self._recorded_here = False  # whether prepare() wrote job.json (forget_if_empty)

    def check(self, settings: dict, overwrite: bool) -> None:
        """Refuse to resume a job with other settings (read-only: safe before any other check)."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--out {self.path} is a file, not a folder")
        if overwrite or not self.path.is_dir():
            return
        recorded = self._recorded()
        if recorded is None:
            if self._shards():
                raise UserError(
                    f"{self.path} already holds part-* files but no {SETTINGS_FILE}: it is not "
                    "a bulkgen job folder; choose another --out, or pass --overwrite to replace "
                    "them"
                )
            return
        if not self._nothing_written():  # (a job killed before its first shard has no rows
            self._refuse_other_settings(recorded, settings)  # to mix other settings' with)

    def _refuse_other_settings(self, recorded: dict, settings: dict) -> None:
        diffs = settings_differences(recorded.get("settings", {}), settings)
        if diffs:
            raise UserError(
                f"{self.path} holds a job with other settings ({'; '.join(diffs)}): rerun with "
                "the same settings to resume it, pass --overwrite to start over, or choose "
                "another --out"
            )

    def check_inputs(
        self, current: dict[str, dict], allow_changed: bool, overwrite: bool
    ) -> list[str]:
        """Refuse to resume a job whose input files changed (fingerprints: io/fingerprint.py),
        or whose files' rows would get other default ids (even with allow_changed: ids are what
        a resume matches rows by). The recorded files in their order (Reader.recorded_first)."""
        recorded = None if overwrite or self._nothing_written() else self._recorded()
        if recorded is None:  # (nothing written yet: no row to match, no order to keep)
            return []
        check_same_names(recorded.get("input_files"), current, self.path)
        if not allow_changed:
            check_unchanged(recorded.get("input_files"), current, self.path)
        return list(recorded.get("input_files") or ())

    def lock(self) -> None:
        """Hold an exclusive lock on the folder; the OS releases it if the process dies."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise output_error(self.path, f"create {LOCK_FILE}", e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"another bulkgen run is writing to {self.path}; wait for it") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def prepare(self, record: dict, overwrite: bool) -> Done:
        """Clear the folder on overwrite, drop stray temporaries, record the job (or, holding
        the lock, refuse one recorded with other settings since check()), scan shards."""
        try:
            if overwrite:
                for path in self._shards() + [self.path / STATS_FILE, self.path / SETTINGS_FILE]:
                    path.unlink(missing_ok=True)
                for path in self.path.glob(".attempt-*"):  # io/fence.py's attempt claims
                    path.unlink(missing_ok=True)
            for path in self.path.glob(TEMP_PREFIX + "*"):
                path.unlink(missing_ok=True)
        except OSError as e:
            raise output_error(self.path, "remove old files", e) from None
        recorded = self._recorded()
        if recorded is None or self._nothing_written():  # a new job, or one that wrote nothing
            write_json_atomic(self.path / SETTINGS_FILE, record)
            self._recorded_here = True
        else:  # checked before the model loaded; another run may have recorded it since
            self._refuse_other_settings(recorded, record["settings"])
            check_same_revision(recorded.get("model_path"), record.get("model_path"), self.path)
            check_same_names(recorded.get("input_files"), record.get("input_files", {}), self.path)
            self.update(record.get("input_files"), record.get("job_seed"))
        self.drop_duplicates()
        return self.scan()

    def update(self, inputs: dict[str, dict] | None, job_seed: int | None = None) -> None:
        """A rerun's additions to job.json, if it exists: the inputs' fingerprints as they are
        now (checked or allowed before: what the next rerun compares), and a job_seed first
        needed now (added inputs whose rows may sample; the first inputs' rows could not)."""
        recorded = self._recorded()
        if recorded is None:
            return
        updated = dict(recorded)
        if inputs is not None:
            updated["input_files"] = {**recorded.get("input_files", {}), **inputs}
        if job_seed is not None:
            updated.setdefault("job_seed", job_seed)
        if updated != recorded:
            write_json_atomic(self.path / SETTINGS_FILE, updated)

    def drop_duplicates(self) -> int:
        """Rows that two final shards hold (a fenced retry's race, io/fence.py) are kept in the
        first one only. Call it holding the lock, with no worker running."""
        from bulkgen.io.fence import drop_duplicates

        try:
            shards = self._shards()
            # Only data-parallel workers' shards (part-wII-...) can repeat rows: one process
            # holds the lock and skips the rows done. Without them, no read of every shard.
            if not any(_SHARD.fullmatch(p.name)[1] for p in shards):
                return 0
            return drop_duplicates(shards)
        except OSError as e:
            raise output_error(self.path, "rewrite a shard holding repeated rows", e) from None

    def _nothing_written(self) -> bool:
        """No shard, and no data-parallel worker's attempt claim (io/fence.py): a worker of a
        killed run may still be alive (a Ray actor) and land a shard of the old settings."""
        return not self._shards() and not any(self.path.glob(ATTEMPT_PREFIX + "*"))

    def forget_if_empty(self) -> None:
        """Undo the record prepare() wrote, if the job failed before writing any shard, so that
        a rerun with other settings (a fixed --model, say) is not refused as a changed job."""
        if self._recorded_here and not self._shards():
            (self.path / SETTINGS_FILE).unlink(missing_ok=True)

    def scan(self, prefix: str = "", keep_ids: bool = True) -> Done:
        """What all complete shards hold, whoever wrote them; next_index numbers the shards
        named with prefix (a data-parallel worker's), so each writer continues its own.
        keep_ids=False leaves ids and samples empty (a worker needs the counts only)."""
        done = Done()
        masks: dict[str, int] = {}
        for path in self._shards():
            table = self._read_summary(path)
            ids = table.column("id").to_pylist() if keep_ids else []
            done.ids.update(ids)
            if keep_ids and "sample" in table.column_names:
                for row_id, sample in zip(ids, table.column("sample").to_pylist(), strict=True):
                    bit = -1 if sample == -1 else 1 << (sample or 0)
                    masks[row_id] = masks.get(row_id, 0) | bit
            done.add(table)
            done.shards.append(path.name)
            match = _SHARD.fullmatch(path.name)
            if match[1] == prefix:
                done.next_index = max(done.next_index, int(match[2]) + 1)
        done.samples = {row_id: mask for row_id, mask in masks.items() if mask != 1}
        return done

    def counted(self, names: list[str]) -> Done:
        """The counts of these shards alone (a run's own), without their ids: what a run added,
        found without reading again every shard of the job it resumed (at 20,000 shards that
        read took 30 s at the end of each run)."""
        done = Done(shards=list(names))
        for name in names:
            done.add(self._read_summary(self.path / name))
        return done

    def kept_types(self, columns: tuple[str, ...]) -> dict[str, pa.DataType] | None:
        """The kept columns' types in the job's Parquet shards, if it has one: a rerun keeps
        the schema its first run fixed."""
        for path in self._shards():
            if path.suffix == ".parquet":
                schema = pq.read_schema(path)
                return {n: schema.field(n).type for n in columns if n in schema.names}
        return None

    def _shards(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.iterdir() if _SHARD.fullmatch(p.name))

    def _recorded(self) -> dict | None:
        path = self.path / SETTINGS_FILE
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise UserError(f"{path} is damaged ({e}); delete it or pass --overwrite") from e

    def job_seed(self) -> int | None:
        """The seed drawn for this job when it was first recorded (None in older job folders)."""
        recorded = self._recorded()
        return None if recorded is None else recorded.get("job_seed")

    def _read_summary(self, path: Path) -> pa.Table:
        try:
            return read_summary(path)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
            raise UserError(
                f"shard {path} cannot be read ({e}); delete it to generate its rows again"
            ) from e


def write_json_atomic(path: Path, data: dict) -> None:
    """Write path whole or not at all; an OutputError (its temporary removed) if it cannot."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        remove_quietly(tmp)
        raise output_error(path.parent, f"write {path.name}", e) from None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
