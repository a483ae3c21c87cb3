"""scripts/spy_summary.py: a py-spy raw profile of a run, summarized by thread and by the engine
thread's phase (a hand-written profile in py-spy's raw format)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from spy_summary import parse, summarize  # noqa: E402

PROC = 'process 7:"python3 scripts/bench.py"'
ENGINE = f"{PROC};thread (9): bulkgen-engine;Thread.run (threading.py:982);Engine._step (e.py:1)"
RAW = [
    f"{ENGINE};Scheduler.schedule (scheduler.py:150);len (x.py:1) 30\n",
    f"{ENGINE};ModelRunner.forward (runner.py:1);InputPacker.pack (inputs.py:151) 20\n",
    f"{ENGINE};ModelRunner.forward (runner.py:1);ModelRunner.forward_packed (runner.py:2) 10\n",
    f"{ENGINE};Engine._apply_prev (e.py:2);Scheduler.update (scheduler.py:260) 20\n",
    f"{PROC};thread (8): bulkgen-writer;ShardWriter.flush (writer.py:3) 20\n",
    f"{PROC};thread (7): MainThread;_find_and_load (<frozen importlib>:1);exec (x.py:1) 450\n",
    f"{PROC};thread (7): MainThread;run (p.py:1);checked_parts (preflight.py:51);deepcopy 50\n",
    f"{PROC};thread (7): MainThread 40\n",
    "not a profile line\n",
]


def test_shares_by_thread_and_engine_phase_leave_the_start_out():
    summary = summarize(parse(RAW), "bulkgen-engine", top=2)
    assert summary["samples"] == 100 and summary["startup_samples"] == 500
    assert summary["no_python_frame_samples"] == 40
    assert summary["thread_share"] == {"bulkgen-engine": 0.8, "bulkgen-writer": 0.2}
    phases = summary["engine_phase_share"]
    assert phases == {"schedule": 0.375, "pack": 0.25, "update": 0.25, "forward": 0.125}
    assert summary["top_leaves"]["bulkgen-engine"][0] == ("len", 30)
    assert summary["top_leaves"]["bulkgen-writer"] == [("ShardWriter.flush", 20)]
