"""A tensor-parallel group when a step does not end as planned (tp_group.RankGroup.stepping,
tp_steps.py), on the CPU over gloo: Ctrl-C during LLM.generate leaves the LLM usable; a second
tensor-parallel LLM in one process is refused without breaking the first; a stuck rank ends
bulkgen run in one line; a bad BULKGEN_TP_TIMEOUT_S is one line. From helper-45's audit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bulkgen.engine import tp_membership
from bulkgen.errors import UserError

REPO = Path(__file__).resolve().parent.parent


def python(code: str, model: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code.replace("MODEL", repr(str(model)))],
                          env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_ctrl_c_during_generate_leaves_the_tensor_parallel_llm_usable(tiny_model_dir):
    """The first Ctrl-C waits for the step to end (rank 0 leaving it half done left rank 1 in
    its collectives: the next call's met them and gloo aborted the process, or it hung)."""
    done = python(
        r"""
import os, signal, threading
from bulkgen import LLM, SamplingParams
G = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
P = [[5, 6, 7, 8], [9, 10, 11]]
llm = LLM(MODEL, dtype="float32", device="cpu", tensor_parallel=2)
before = [o.token_ids for o in llm.generate(P, G)]
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    llm.generate([[5, 6, 7]] * 8, SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True))
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
after = [o.token_ids for o in llm.generate(P, G)]
llm.close()
print("same" if after == before else "different")
""",
        tiny_model_dir,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split() == ["interrupted", "same"]


def test_a_second_tensor_parallel_llm_is_refused_and_the_first_keeps_working(tiny_model_dir):
    done = python(
        r"""
from bulkgen import LLM, SamplingParams
G = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
first = LLM(MODEL, dtype="float32", device="cpu", tensor_parallel=2)
before = [o.token_ids for o in first.generate([[5, 6, 7]], G)]
try:
    LLM(MODEL, dtype="float32", device="cpu", tensor_parallel=2)
    print("second made")
except Exception as e:
    print("refused:", e)
print("first works" if [o.token_ids for o in first.generate([[5, 6, 7]], G)] == before else "no")
first.close()
""",
        tiny_model_dir,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    lines = done.stdout.splitlines()
    assert (
        lines[0].startswith("refused: a tensor-parallel engine is already open")
        and "close" in lines[0]
    )
    assert lines[-1] == "first works"


def test_a_stuck_rank_ends_the_run_in_one_line(tmp_path, tiny_model_dir):
    """A rank alive but stopped (SIGSTOP): after BULKGEN_TP_TIMEOUT_S the job ends with one
    error line (it was a 70-85-line gloo traceback naming no rank)."""
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"prompt": f"fox {i} jumps"}) + "\n" for i in range(40)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "BULKGEN_TP_TIMEOUT_S": "8"}
    args = [sys.executable, "-m", "bulkgen.cli", "run", str(inputs), "-m", str(tiny_model_dir),
            "--device", "cpu", "-q", "--max-tokens", "32", "--tp", "2", "--max-num-seqs", "4",
            "--shard-size", "4", "-o", str(tmp_path / "out")]  # fmt: skip
    job = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    rank = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and rank is None:
            found = subprocess.run(["pgrep", "-P", str(job.pid), "-f", "tp_worker"],
                                   capture_output=True, text=True).stdout.split()  # fmt: skip
            if found and list((tmp_path / "out").glob("part-*")):
                rank = int(found[0])
            time.sleep(0.2)
        assert rank is not None, "rank 1 or a first shard never appeared"
        os.kill(rank, 19)  # SIGSTOP
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
        if rank is not None:
            subprocess.run(["kill", "-9", str(rank)], capture_output=True)
    lines = [line for line in err.splitlines() if line.strip()]
    assert job.returncode == 1 and len(lines) == 1, err[-2000:]
    assert "collective did not complete within 8 s" in lines[0] and "stuck" in lines[0]


@pytest.mark.parametrize("value", ["-5", "abc", "0", "inf"])
def test_a_bad_collective_timeout_is_one_line_naming_it(monkeypatch, value):
    monkeypatch.setenv("BULKGEN_TP_TIMEOUT_S", value)
    with pytest.raises(UserError, match=f"BULKGEN_TP_TIMEOUT_S must be a positive number.*{value}"):
        tp_membership.timeout_s()
    monkeypatch.setenv("BULKGEN_TP_TIMEOUT_S", "30")
    assert tp_membership.timeout_s() == 30.0
