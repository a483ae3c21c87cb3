"""A full disk, an I/O error or a lost output folder stops the job in one line, exit 1.

Faults are injected into os.fsync of the files being written (a full disk shows up there or in
write(); either way inside the writer's try), so the temporary file exists when the fault comes:
it must be removed, the complete shards kept, and a rerun must resume exactly once.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV

ROWS = 50


@pytest.fixture
def job(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1}))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(ROWS)))
    out = tmp_path / "out"
    args = [str(inp), "-m", str(tiny_model_dir), "-o", str(out), "--shard-size", "10"]
    return out, args


def bulkgen_run(args):
    return CliRunner().invoke(main, ["run", *args])


def fail_fsync(monkeypatch, name_prefix: str, after: int, code: int, then=None) -> None:
    """os.fsync of files named name_prefix* fails with `code` once `after` of them succeeded
    (then() runs first: to remove the folder, say)."""
    real, seen = os.fsync, []

    def fsync(fd: int) -> None:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(name_prefix):
            seen.append(fd)
            if len(seen) > after:
                if then is not None:
                    then()
                raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.output and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot "), lines[0]
    return lines[0]


def ids(out: Path) -> list[str]:
    return [i for p in sorted(out.glob("part-*")) for i in pq.read_table(p)["id"].to_pylist()]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_full_disk_stops_in_one_line_and_the_rerun_resumes_exactly_once(job, monkeypatch, code):
    out, args = job
    with monkeypatch.context() as patch:
        fail_fsync(patch, ".part-", after=2, code=code)
        line = one_error_line(bulkgen_run(args))
    assert f"write shard part-00002.parquet in {out}" in line
    assert os.strerror(code) in line and errno.errorcode[code] in line
    assert "rerun the same command" in line
    assert ("free space" in line) is (code == errno.ENOSPC)  # an I/O error: fix the folder
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == [
        "job.json", "part-00000.parquet", "part-00001.parquet"]  # fmt: skip
    assert len(ids(out)) == 20

    rerun = bulkgen_run(args)  # space freed
    assert rerun.exit_code == 0, rerun.output
    assert sorted(ids(out)) == sorted(f"in:{i}" for i in range(ROWS))


def test_a_failed_job_json_write_leaves_no_temporary(job, monkeypatch):
    out, args = job
    with monkeypatch.context() as patch:
        fail_fsync(patch, "job.json.tmp", after=0, code=errno.ENOSPC)
        line = one_error_line(bulkgen_run(args))
    assert f"write job.json in {out}" in line
    assert not list(out.glob("*.tmp")) and not list(out.glob("part-*"))
    assert bulkgen_run(args).exit_code == 0
    assert len(set(ids(out))) == len(ids(out)) == ROWS


def test_the_output_folder_removed_mid_run_is_one_line(job, monkeypatch):
    out, args = job
    with monkeypatch.context() as patch:
        fail_fsync(patch, ".part-", after=1, code=errno.ENOENT, then=lambda: shutil.rmtree(out))
        line = one_error_line(bulkgen_run(args))
    assert f"in {out}" in line and "ENOENT" in line
    assert bulkgen_run(args).exit_code == 0  # a rerun starts the job again
    assert sorted(ids(out)) == sorted(f"in:{i}" for i in range(ROWS))


def _tmpfs(path: Path) -> bool:
    path.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                              capture_output=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_a_small_tmpfs_fills_up_and_the_rerun_after_freeing_space_completes(tmp_path, job):
    disk = tmp_path / "disk"
    if not _tmpfs(disk):
        pytest.skip("mounting a tmpfs needs root")
    try:
        out, args = job
        big = disk / "filler"
        big.write_bytes(b"x" * 40_000)  # leaves room for job.json and a shard or two
        args = [*args[:-4], "-o", str(disk / "out"), "--shard-size", "10"]
        line = one_error_line(bulkgen_run(args))
        assert "No space left on device (ENOSPC)" in line
        assert not list((disk / "out").glob(".part-*")) and not list(disk.glob("out/*.tmp"))
        big.unlink()
        assert bulkgen_run(args).exit_code == 0
        assert sorted(ids(disk / "out")) == sorted(f"in:{i}" for i in range(ROWS))
    finally:  # a file still open in the job's threads makes umount busy: then detach it (-l)
        if subprocess.run(["umount", str(disk)], capture_output=True, timeout=10).returncode:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=10)
