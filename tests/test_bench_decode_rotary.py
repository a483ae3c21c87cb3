"""scripts/bench_decode_rotary.py (run on the GPU machine): on the CPU, under the Triton
interpreter with each form run once instead of timed, its two forms give the same output and
it prints a line per cache and row count with their ratio."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

# Before triton is imported (the script imports the kernels).
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_attention  # noqa: E402
import bench_decode_rotary  # noqa: E402
import pytest  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the script itself")
def test_both_forms_give_the_same_output_and_each_row_count_a_line(monkeypatch, capsys):
    monkeypatch.setattr(bench_attention, "DEVICE", torch.device("cpu"))
    monkeypatch.setattr(bench_decode_rotary, "LAYERS", 1)
    outputs = []

    def once(calls):  # each form run once; "apart" takes 1 us a call, "fused" 2
        outputs.append([call() for call in calls])
        return 2.0 if len(outputs) % 2 == 0 else 1.0

    monkeypatch.setattr(bench_decode_rotary, "timed", once)
    argv = ["bench_decode_rotary.py", "--rows", "2,3", "--context", "40", "--caches", "bf16"]
    monkeypatch.setattr(sys, "argv", argv)
    bench_decode_rotary.main()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["cache"], x["rows"]) for x in lines] == [("bf16", 2), ("bf16", 3)]
    assert all(x["fused_over_apart"] == 2.0 for x in lines)
    # Both forms run over the same caches: the new token written alike, the same attention.
    for apart, fused in zip(outputs[::2], outputs[1::2], strict=True):
        assert torch.equal(apart[0], fused[0])
