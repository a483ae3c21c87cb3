"""What commit a bench line names (scripts/bench_measure.git_commit): GIT_COMMIT when a device
call passes it, else HEAD, marked "-dirty" when tracked files differ from HEAD (a device copy
can carry an older .git than its files); untracked files do not count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_measure import git_commit  # noqa: E402


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_head_plain_dirty_when_tracked_files_differ_and_the_variable_wins(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    git(tmp_path, "add", "kernel.py")
    git(tmp_path, "commit", "-qm", "first")
    head = git(tmp_path, "rev-parse", "--short", "HEAD")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert git_commit() == head
    (tmp_path / "kernel.py").write_text("a = 2\n")
    assert git_commit() == head + "-dirty"
    monkeypatch.setenv("GIT_COMMIT", "abc1234")
    assert git_commit() == "abc1234"
