"""--data-parallel N when a process dies: a killed worker fails the job in one line and a rerun
completes it, each row once; killing the parent ends its workers (test_parallel.py: the rest).

Runs that must last long enough to be killed use the FakeEngine (BULKGEN_FAKE_ENGINE, a switch
for tests) with a delay per step; the tokenizer, reader, writer and job folder are the real ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_parallel import REPO, rows_done, shard_rows, wait_until, write_prompts

from bulkgen.engine.fake import FAKE_ENGINE_ENV


def worker_pids(parent: int) -> list[int]:
    """The spawned worker processes of a parent (its multiprocessing children, not the
    resource tracker), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def test_a_killed_worker_fails_the_job_and_a_rerun_with_another_n_completes_it(
    tmp_path, tiny_model_dir
):
    rows = 1500
    prompts = write_prompts(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "bulkgen.cli", "run", str(prompts), "-m", str(tiny_model_dir),
            "-o", str(out), "-q", "--shard-size", "50", "--max-num-seqs", "16"]  # fmt: skip
    env = {**os.environ, FAKE_ENGINE_ENV: json.dumps({"steps": 2, "step_delay": 0.02})}
    proc = subprocess.Popen(
        [*args, "--data-parallel", "2"], env=env, cwd=REPO, stderr=subprocess.PIPE
    )
    try:
        wait_until(lambda: out.is_dir() and rows_done(out, "part-w*") > 0, timeout=120)
        workers = worker_pids(proc.pid)
        assert len(workers) == 2 and 0 < rows_done(out) < rows
        os.kill(workers[0], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - killed_at < 15, "the job fails promptly"
    assert proc.returncode == 1
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: data-parallel worker "), lines
    assert f"worker process {workers[0]} was killed by SIGKILL" in lines[0]
    assert "rerun the same command to resume" in lines[0].lower()
    assert not worker_pids(proc.pid) and not Path(f"/proc/{workers[1]}").exists()
    done = rows_done(out)
    assert done < rows

    rerun = subprocess.run(
        [*args, "--data-parallel", "3"], env={**env, FAKE_ENGINE_ENV: '{"steps": 1}'},
        cwd=REPO, capture_output=True, timeout=120,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr.decode()
    ids = [r["id"] for r in shard_rows(out)]
    assert len(ids) == len(set(ids)) == rows
    assert not list(out.glob(".part-*"))
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rows"] == rows and stats["this_run"]["resumed_after_rows"] == done
    assert stats["this_run"]["rows"] == rows - done
    assert sum(w["rows_handed"] for w in stats["workers"]) == rows - done, "each missing row once"


def test_workers_end_at_once_when_their_parent_is_killed(tmp_path, tiny_model_dir):
    """The parent holds the folder's lock: a worker left writing would race a rerun."""
    prompts = write_prompts(tmp_path / "in.jsonl", 2000)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "bulkgen.cli", "run", prompts, "-m", tiny_model_dir, "-o", out,
            "-q", "--shard-size", "50", "--max-num-seqs", "16", "--data-parallel", "2"]  # fmt: skip
    env = {**os.environ, FAKE_ENGINE_ENV: json.dumps({"steps": 2, "step_delay": 0.02})}
    proc = subprocess.Popen([str(a) for a in args], env=env, cwd=REPO)
    try:
        wait_until(lambda: out.is_dir() and rows_done(out, "part-w*") > 0, timeout=120)
        workers = worker_pids(proc.pid)
        assert len(workers) == 2
    finally:
        proc.kill()
        proc.wait()

    def gone(pid: int) -> bool:
        try:
            return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
        except OSError:
            return True

    wait_until(lambda: all(gone(pid) for pid in workers), timeout=5)
    assert all(gone(pid) for pid in workers)
    written = sorted(p.name for p in out.glob("part-*"))
    time.sleep(0.5)
    assert sorted(p.name for p in out.glob("part-*")) == written
    assert rows_done(out) < 2000
