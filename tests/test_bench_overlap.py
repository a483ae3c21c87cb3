"""scripts/bench_overlap.py (run on the GPU machine): on the CPU, under the Triton interpreter
and with each form run once instead of timed, a half's attention is those rows of the whole
batch's, a half's GEMMs those rows of the whole's, and it prints a line per cache and row count."""

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
import bench_overlap  # noqa: E402
import pytest  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the script")


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(bench_attention, "DEVICE", torch.device("cpu"))
    monkeypatch.setattr(bench_overlap, "HIDDEN", 256)
    monkeypatch.setattr(bench_overlap, "INTERMEDIATE", 512)


def test_a_halfs_parts_are_its_rows_of_the_whole_batchs(small):
    layer = bench_overlap.Layer(5, 40, torch.bfloat16)
    whole = layer.attention(0, 5).float()
    for lo, hi in ((0, 2), (2, 5)):
        torch.testing.assert_close(layer.attention(lo, hi).float(), whole[lo:hi])
        assert torch.equal(layer.gemms(lo, hi), layer.gemms(0, 5)[lo:hi])


def test_each_cache_and_row_count_prints_its_forms_and_ratios(small, monkeypatch, capsys):
    times = iter([100.0, 110.0, 70.0, 40.0, 60.0] * 2)  # serial, halves, overlap, attention, gemms
    monkeypatch.setattr(bench_overlap, "timed", lambda run: run() or next(times))
    argv = ["bench_overlap.py", "--rows", "2,3", "--context", "40", "--caches", "bf16",
            "--layers", "2"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    bench_overlap.main()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["cache"], x["rows"]) for x in lines] == [("bf16", 2), ("bf16", 3)]
    assert lines[0]["serial_us"] == 50.0 and lines[0]["overlap_us"] == 35.0  # per layer
    assert lines[0]["overlap_over_serial"] == 0.7
    assert lines[0]["overlap_over_larger_part"] == round(70 / 60, 4)


def test_a_carveout_holds_while_its_form_is_captured_and_is_cleared_after(monkeypatch):
    seen = []
    monkeypatch.setattr(bench_overlap, "timed", lambda run: seen.append(run()) or 1.0)
    assert bench_overlap.with_carveout(32, torch._C._get_sm_carveout_experimental) == 1.0
    assert seen == [32] and torch._C._get_sm_carveout_experimental() is None
