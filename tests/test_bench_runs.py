"""scripts/bench.py --dry-run: the runs a device call would make, checked on the CPU before the
call (3aa695a's sweep of --max-batch-tokens left the setting out of each run and every run of a
device call failed at once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dry_run(tmp_path, *args: str) -> list[dict]:
    cmd = [sys.executable, "scripts/bench.py", "--dry-run", "--out", str(tmp_path), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return [line for line in lines if "engine" in line]


def test_a_sweep_runs_every_bulkgen_engine_at_every_setting_and_transformers_once(tmp_path):
    runs = dry_run(
        tmp_path,
        *("--workloads", "trt", "--engines", "bulkgen,bulkgen-fp8,transformers"),
        *("--max-num-seqs", "256,auto", "--max-batch-tokens", "2048,4096"),
        *("--num-prompts", "300"),
    )
    settings = [(r["engine"], r["max_num_seqs"], r["max_batch_tokens"]) for r in runs]
    grid = [(s, t) for s in ("256", "auto") for t in ("2048", "4096")]
    assert settings == [
        *(("bulkgen", s, t) for s, t in grid),
        *(("bulkgen-fp8", s, t) for s, t in grid),
        ("transformers-sync", "256", "2048"),
        ("transformers-async", "256", "2048"),
    ]
    assert {r["workload"] for r in runs} == {"trt"} and {r["sampling"] for r in runs} == {"greedy"}


def test_settings_that_cannot_change_a_run_are_left_out(tmp_path):
    runs = dry_run(
        tmp_path,
        *("--workloads", "trt", "--engines", "bulkgen", "--sampling", "greedy,sample"),
        *("--max-num-seqs", "128,256,512,auto", "--num-prompts", "200"),
    )
    seqs = [(r["sampling"], r["max_num_seqs"]) for r in runs]
    # 200 requests: 256 already admits them all, so 512 would run them the same way.
    assert seqs == [(s, n) for s in ("greedy", "sample") for n in ("128", "256", "auto")]
    assert all(r["max_batch_tokens"] == "" for r in runs), "no --max-batch-tokens: the default"
