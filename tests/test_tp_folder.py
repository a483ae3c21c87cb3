"""A tensor-parallel group's temporary folder: a new group removes those whose owner is gone
(a signal that ended every process of a group at once left them in /tmp for good)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from test_tensor_parallel import alive, rank_pids, rows_done, wait_until, write_prompts

from bulkgen.engine import tp_folder
from bulkgen.engine.tp_folder import OWNER, PREFIX, group_folder, owner_pid, remove_stale


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def folder(parent, name: str, owner: str | None, age_s: float = 0.0):
    path = parent / (PREFIX + name)
    path.mkdir()
    (path / "rank1.log").write_text("")
    if owner is not None:
        (path / OWNER).write_text(owner)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_a_new_group_removes_the_folders_of_dead_owners_only(tmp_path):
    dead = folder(tmp_path, "dead", str(dead_pid()))
    mine = folder(tmp_path, "mine", str(os.getpid()))
    young = folder(tmp_path, "young", None)  # being made: its owner file comes next
    old = folder(tmp_path, "old", None, age_s=2 * 3600)
    garbled = folder(tmp_path, "garbled", "not a pid")
    other = tmp_path / "unrelated"
    other.mkdir()
    new = group_folder(str(tmp_path))
    assert not dead.exists() and not old.exists()
    assert mine.exists() and young.exists() and garbled.exists() and other.exists()
    assert new.name.startswith(PREFIX) and owner_pid(new) == os.getpid()
    assert remove_stale(str(tmp_path)) == []  # nothing left to remove, the new folder kept


def test_a_folder_owned_in_another_pid_namespace_or_host_is_left(tmp_path, monkeypatch):
    """Two containers sharing /tmp: the other's owner pid does not exist here, yet it is alive.
    Only an owner of this host and PID namespace is looked up."""
    gone = dead_pid()
    here = tp_folder._place()
    elsewhere = folder(tmp_path, "elsewhere", f"{gone}\nother-host pid:[1]")
    local = folder(tmp_path, "local", f"{gone}\n{here}")
    assert remove_stale(str(tmp_path)) == [local] and elsewhere.exists()


def test_another_users_folder_is_left(tmp_path, monkeypatch):
    path = folder(tmp_path, "theirs", str(dead_pid()))
    monkeypatch.setattr(tp_folder.os, "getuid", lambda: os.stat(path).st_uid + 1)
    assert remove_stale(str(tmp_path)) == [] and path.exists()


def test_a_group_killed_at_once_leaves_a_folder_the_next_group_removes(tmp_path, tiny_model_dir):
    """End to end (CPU, gloo): SIGKILL to rank 0 and its rank together, as a signal to a
    process group does, leaves the group's folder; the next --tp run removes it."""
    from test_tensor_parallel import run_cli

    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    prompts = write_prompts(tmp_path / "in.jsonl", 200)
    out = tmp_path / "out"
    args = [prompts, "-m", tiny_model_dir, "--device", "cpu", "-o", out, "--tp", "2", "-q",
            "--max-tokens", "64", "--max-num-seqs", "2", "--shard-size", "1"]  # fmt: skip
    job = run_cli(args, env=env)
    wait_until(lambda: rows_done(out) >= 1 or job.poll() is not None, timeout=120)
    ranks = rank_pids(job.pid)
    assert len(ranks) == 1 and job.poll() is None
    for pid in [job.pid, *ranks]:
        os.kill(pid, signal.SIGKILL)
    job.wait()
    wait_until(lambda: not alive(ranks[0]), timeout=5)
    [left] = temp.glob(PREFIX + "*")
    assert owner_pid(left) == job.pid
    small = write_prompts(tmp_path / "small.jsonl", 2)
    later = run_cli([small, "-m", tiny_model_dir, "--device", "cpu", "-o", tmp_path / "out2",
                     "--tp", "2", "-q", "--max-tokens", "4"], env=env)  # fmt: skip
    assert later.wait(timeout=300) == 0, later.stderr.read()
    assert not left.exists() and not list(temp.glob(PREFIX + "*"))
