"""`bulkgen run` ends with the status a scheduler expects, never a C++ abort (exits.py).

Real subprocesses on the tiny model with the real engine, progress display on (stderr is a pipe,
so the plain-line display and its thread): 0 when done, 130 after SIGINT, 143 after SIGTERM, the
finished rows kept, and never "terminate called" (status 134) on the way out. The full loop (30
runs, 10 interrupts) is marked slow; the default suite runs a short one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bulkgen.exits import Terminated, interrupt_status

REPO = Path(__file__).resolve().parent.parent
# One torch thread per run: two runs go side by side on a 2-core machine.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def interruptible() -> None:
    """In the child before it starts: SIGINT's default disposition. A shell without job control
    starts background commands with SIGINT ignored (a suite run as `pytest ... &`), the child
    would inherit that, and Python then installs no KeyboardInterrupt: Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_args(inp: Path, out: Path, model: Path) -> list[str]:
    return [sys.executable, "-m", "bulkgen.cli", "run", str(inp), "-m", str(model), "-o",
            str(out), "--max-tokens", "8", "--shard-size", "50"]  # fmt: skip


def complete(inp: Path, out: Path, model: Path) -> tuple[int, str]:
    done = subprocess.run(run_args(inp, out, model), env=ENV, cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    return done.returncode, done.stderr


def interrupted(inp: Path, out: Path, model: Path, sig: int) -> tuple[int, str]:
    proc = subprocess.Popen(run_args(inp, out, model), env=ENV, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=interruptible)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(out.glob("part-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)  # until it is generating: its first shard is written
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr.decode()


def ids_in(out: Path) -> list[str]:
    shards = sorted(out.glob("part-*.parquet"))
    return [i for p in shards for i in pq.read_table(p)["id"].to_pylist()]


def prompts(path: Path, rows: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(rows)))
    return path


def check_runs(tmp_path: Path, model: Path, runs: int, interrupts: int) -> None:
    small = prompts(tmp_path / "small.jsonl", 3)
    outs = [tmp_path / f"done{i}" for i in range(runs)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda out: complete(small, out, model), outs))
    for status, stderr in results:
        assert "terminate called" not in stderr
        assert status == 0, stderr
    assert all(len(ids_in(out)) == 3 for out in outs)

    large = prompts(tmp_path / "large.jsonl", 20000)
    sigs = [signal.SIGINT, signal.SIGTERM] * (interrupts // 2)
    for i, sig in enumerate(sigs):
        out = tmp_path / f"stopped{i}"
        status, stderr = interrupted(large, out, model, sig)
        assert "terminate called" not in stderr
        assert status == 128 + sig, stderr
        assert "rerun the same command to resume" in stderr
        kept = ids_in(out)  # complete shards only, each readable, no row twice
        assert 0 < len(kept) < 20000 and len(kept) == len(set(kept))
        assert not list(out.glob(".part-*")) and not list(out.glob("*.tmp"))


def test_runs_end_0_and_interrupted_runs_130_or_143_never_an_abort(tmp_path, tiny_model_dir):
    check_runs(tmp_path, tiny_model_dir, runs=2, interrupts=2)


@pytest.mark.slow
def test_thirty_runs_and_ten_interrupts_end_with_the_right_statuses(tmp_path, tiny_model_dir):
    check_runs(tmp_path, tiny_model_dir, runs=30, interrupts=10)


def test_sigterm_is_an_interrupt_with_status_143():
    assert isinstance(Terminated(), KeyboardInterrupt)
    assert interrupt_status(Terminated()) == 143
    assert interrupt_status(KeyboardInterrupt()) == 130
