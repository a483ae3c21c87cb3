"""kill -9 of a running `bulkgen run` at random points, then reruns: every row exactly once.

The runs use the FakeEngine (selected through BULKGEN_FAKE_ENGINE, a switch for tests) with a
small delay per step, so that a run lasts a few seconds and the kills land while shards are
being produced; the tokenizer, reader, writer and job folder are the real ones.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
from test_exits import interruptible

from bulkgen.engine.fake import FAKE_ENGINE_ENV

ROWS = 3000
REPO = Path(__file__).resolve().parent.parent


def start(args: list[str], env: dict) -> subprocess.Popen:
    """`bulkgen run` in a child that Ctrl-C reaches (test_exits.interruptible)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bulkgen.cli", "run", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )


def rows_done(out: Path) -> int:
    return sum(pq.read_metadata(p).num_rows for p in out.glob("part-*.parquet"))


def wait_for_progress(out: Path, before: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until this run has written a shard of its own (or ended): start-up time varies a lot
    with the machine's load, and a kill before any work proves nothing."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if rows_done(out) > before:
            return
        time.sleep(0.05)


def test_kill_9_at_random_points_then_rerun_gives_every_row_exactly_once(tmp_path, tiny_model_dir):
    lines = [json.dumps({"prompt": f"Question number {i}?"}) for i in range(ROWS)]
    lines[17] = "{broken json"
    lines[1234] = json.dumps({"prompt": None})
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    args = [str(tmp_path / "in.jsonl"), "-m", str(tiny_model_dir), "-o", str(out), "-q",
            "--shard-size", "37", "--max-num-seqs", "16"]  # fmt: skip
    # 3,000 rows of 2 steps at 16 a step sleep 3.75 s in steps alone, so five kills at most 0.8 s
    # after a run's first shard land mid-job (at 4 ms a step one full suite run saw a single
    # partial kill of five).
    env = {**os.environ, FAKE_ENGINE_ENV: json.dumps({"steps": 2, "step_delay": 0.01})}
    rng = random.Random(1234)
    partial_kills = 0
    for _ in range(5):
        before = rows_done(out) if out.exists() else 0
        proc = start(args, env)
        wait_for_progress(out, before, proc, timeout=60)
        time.sleep(rng.uniform(0.0, 0.8))  # then a random point of the run
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        done = rows_done(out)
        partial_kills += 0 < done < ROWS
    assert partial_kills >= 2, "the kills should land while the job is running"

    proc = start(args, env)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()
    assert not list(out.glob(".part-*")), "stray temporary shards are cleaned up"
    rows = [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == ROWS
    assert set(ids) == {f"in:{i}" for i in range(ROWS)}
    by_id = {r["id"]: r for r in rows}
    assert by_id["in:17"]["error"].startswith("row 17, line 18: not valid JSON")
    assert by_id["in:1234"]["error"] == "prompt is null"
    assert all(r["text"] for r in rows if r["finish_reason"] != "error")
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rows"] == ROWS and stats["errors"] == 2


def test_ctrl_c_keeps_the_finished_rows_and_a_rerun_completes(tmp_path, tiny_model_dir):
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(20000))
    )
    out = tmp_path / "out"
    args = [str(tmp_path / "in.jsonl"), "-m", str(tiny_model_dir), "-o", str(out), "-q",
            "--shard-size", "100000", "--max-num-seqs", "8"]  # fmt: skip
    env = {**os.environ, FAKE_ENGINE_ENV: json.dumps({"steps": 2, "step_delay": 0.005})}
    proc = start(args, env)
    deadline = time.monotonic() + 60
    while not (out / "job.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"rerun the same command to resume" in stderr
    # The rows finished before Ctrl-C were written as a shard, though it was not full.
    kept = [r for p in out.glob("part-*.parquet") for r in pq.read_table(p).to_pylist()]
    assert 0 < len(kept) < 20000
    proc = start(args, {**env, FAKE_ENGINE_ENV: json.dumps({"steps": 1})})
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()
    ids = [r["id"] for p in out.glob("part-*.parquet") for r in pq.read_table(p).to_pylist()]
    assert len(ids) == len(set(ids)) == 20000
