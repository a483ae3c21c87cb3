"""What commit a bench line names (scripts/bench_commit.git_commit): GIT_COMMIT when a device
call passes it, else HEAD; marked "-dirty" with the tree of the files git does not ignore where
the repository has that commit and they are not its files (a device copy can carry an older
.git than its files: the tree is then the one of the commit whose checkout they are)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_commit import git_commit  # noqa: E402


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_head_plain_dirty_when_the_files_differ_and_the_variable_wins(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    git(tmp_path, "add", "kernel.py")
    git(tmp_path, "commit", "-qm", "first")
    head = git(tmp_path, "rev-parse", "--short", "HEAD")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    assert git_commit() == head
    (tmp_path / "notes.txt").write_text("untracked, so sent to a device\n")
    assert git_commit().startswith(head + "-dirty-tree-")
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "kernel.py").write_text("a = 2\n")
    assert git_commit().startswith(head + "-dirty-tree-")
    monkeypatch.setenv("GIT_COMMIT", "abc1234")  # a commit this .git does not have
    assert git_commit() == "abc1234"
    monkeypatch.setenv("GIT_COMMIT", head)  # one it has, whose files these are not
    assert git_commit().startswith(head + "-dirty-tree-")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    assert git_commit() == head


def test_a_stale_git_names_the_tree_of_the_commit_whose_files_ran(tmp_path, monkeypatch):
    """A device copy: the files of a later commit (a file changed, a file added, an ignored
    folder beside them) over the .git of an earlier one. The tree it names is the later
    commit's, and the repository's own index is left as it was."""
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text(".carry/\n")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "first")
    stale = git(tmp_path, "rev-parse", "--short", "HEAD")
    (tmp_path / "kernel.py").write_text("a = 2\n")
    (tmp_path / "test_new.py").write_text("def test(): pass\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "second")
    later_tree = git(tmp_path, "rev-parse", "HEAD^{tree}")
    git(tmp_path, "reset", "-q", "--mixed", stale)  # HEAD and index back, the files stay
    (tmp_path / ".carry").mkdir()
    (tmp_path / ".carry" / "tokenizer.json").write_text("{}")
    index_before = git(tmp_path, "status", "--porcelain")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    assert git_commit() == f"{stale}-dirty-tree-{later_tree[:10]}"
    assert git(tmp_path, "status", "--porcelain") == index_before
