"""What commit a measurement names: bench lines, tuning tables and accuracy lines carry it
(git_commit), also from a device call's copy of the tree, whose .git may be older than its
files."""

from __future__ import annotations

import os
import subprocess
import tempfile


def git_commit() -> str:
    """GIT_COMMIT when set (a device call passes the commit it runs), else HEAD's short hash; as
    it is when the files git does not ignore are that commit's or this .git lacks the commit,
    else with "-dirty-tree-" and the first 10 hex of those files' git tree. A device copy of the
    tree can hold an older .git than its files (seen 2026-12-02: HEAD read c5e5448 where the
    files were 2958d54's; 2026-12-03 a GIT_COMMIT taken from that .git named d3151d6 for
    b7b0d2d's files, and one typed as $(git rev-parse ...), looked up there, a4b494a for
    a5fef9e's): the tree is then the one of the local commit whose checkout was sent (`git log
    --format='%h %T' | grep TREE` finds it)."""
    named = os.environ.get("GIT_COMMIT")
    try:
        commit = named or rev_parse("--short", "HEAD")
        commit_tree = rev_parse("--verify", "--quiet", f"{commit}^{{tree}}")
    except OSError:
        return named or "unknown"
    if named and not commit_tree:
        return named  # a commit this .git does not have yet: the files cannot be checked
    if not commit:
        return "unknown"
    tree = files_tree()
    return commit if tree == commit_tree else f"{commit}-dirty-tree-{tree[:10]}"


def rev_parse(*args: str) -> str:
    done = subprocess.run(["git", "rev-parse", *args], capture_output=True, text=True)
    return done.stdout.strip()


def files_tree() -> str:
    """The git tree id of the working files git does not ignore, tracked or not (through a
    scratch index: the repository's own index is left alone), or "unknown"."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(scratch, "index")}
        added = subprocess.run(["git", "add", "-A"], env=env, capture_output=True)
        tree = subprocess.run(["git", "write-tree"], env=env, capture_output=True, text=True)
    ok = added.returncode == 0 and tree.returncode == 0
    return tree.stdout.strip() if ok else "unknown"
