"""--format jsonl shards with lines of 2 MiB and more (a long kept column) are read back by the
resume scan, of one process and of a data-parallel parent: pyarrow.json's default block of 1 MiB
fails on them ("straddling object"), and every rerun of such a job said its valid shard could not
be read (found by fuzzing). The runs use the FakeEngine, as test_resume.py's do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.errors import UserError
from bulkgen.io.job import JobDir

REPO = Path(__file__).resolve().parent.parent
LONG = 3_000_000  # characters of a kept column: a shard line of about 3 MB
LONG_ROWS = (0, 57, 199)


def write_prompts(path: Path, count: int) -> Path:
    rows = [
        {"id": f"r{i}", "prompt": f"Question {i}?", "doc": "x" * LONG if i in LONG_ROWS else "s"}
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bulkgen.cli", "run", *args],
        env={**os.environ, **env},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def shard_lines(out: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.open()]


def args_for(tmp_path: Path, model_dir, count: int, *flags: str) -> list[str]:
    prompts = write_prompts(tmp_path / "in.jsonl", count)
    return [str(prompts), "-m", str(model_dir), "-o", str(tmp_path / "out"), "-q",
            "--format", "jsonl", "--keep-columns", "doc", *flags]  # fmt: skip


def test_a_finished_job_with_a_3_mb_line_reruns_to_nothing_to_generate(tmp_path, tiny_model_dir):
    args = args_for(tmp_path, tiny_model_dir, 2)
    env = {FAKE_ENGINE_ENV: json.dumps({"steps": 1})}
    _, stderr = run(args, env).communicate(timeout=120)
    assert len(shard_lines(tmp_path / "out")) == 2, stderr.decode()
    rerun = run([a for a in args if a != "-q"], env)
    _, stderr = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, stderr.decode()
    assert "nothing to generate: all 2 input rows are in complete shards" in stderr.decode()


def test_a_killed_job_with_long_lines_resumes_with_every_row_exactly_once(tmp_path, tiny_model_dir):
    args = args_for(tmp_path, tiny_model_dir, 200, "--shard-size", "10", "--max-num-seqs", "4")
    out = tmp_path / "out"
    proc = run(args, {FAKE_ENGINE_ENV: json.dumps({"steps": 2, "step_delay": 0.02})})
    deadline = time.monotonic() + 60  # 200 rows of 2 steps at 4 a step: 2 s of steps alone
    while len(list(out.glob("part-*.jsonl"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    kept = shard_lines(out)
    assert 0 < len(kept) < 200, "killed mid-job"
    assert any(len(r["doc"]) == LONG for r in kept), "a shard with a long line to resume after"
    # The data-parallel parent scans the shards to hand out the rest; its workers scan them too.
    rerun = run([*args, "--data-parallel", "2"], {FAKE_ENGINE_ENV: json.dumps({"steps": 1})})
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr.decode()
    rows = shard_lines(out)
    assert sorted(r["id"] for r in rows) == sorted(f"r{i}" for i in range(200))
    assert all(len(r["doc"]) == (LONG if int(r["id"][1:]) in LONG_ROWS else 1) for r in rows)


@pytest.mark.parametrize("doc_length", [10, LONG])
def test_a_damaged_jsonl_shard_is_still_reported(tmp_path, doc_length):
    line = json.dumps({"id": "a", "finish_reason": "length", "doc": "x" * doc_length})
    (tmp_path / "part-00000.jsonl").write_text(line + "\n" + line[: len(line) // 2] + "\n")
    with pytest.raises(UserError, match="part-00000.jsonl cannot be read .*; delete it"):
        JobDir(tmp_path).scan()
