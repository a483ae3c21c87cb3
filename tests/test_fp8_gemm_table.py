"""Fp8Linear runs the Triton FP8 GEMM exactly where the measured table (fp8_gemm_table.json)
says, cuBLASLt (torch._scaled_mm) everywhere else, and scripts/tune_fp8_mm.py builds that table
from what it timed.

Without CUDA the Triton kernel runs under the interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order).
"""

from __future__ import annotations

import json
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_fp8 import assert_replays_with_new_inputs  # noqa: E402
from test_fp8_gemm import BF16_STEP, DEVICE, needs_fp8_gpu  # noqa: E402
from torch import nn  # noqa: E402

from bulkgen.model import fp8_gemm_table  # noqa: E402
from bulkgen.model.fp8 import Fp8Linear  # noqa: E402
from bulkgen.model.fp8_gemm import CANDIDATES  # noqa: E402
from bulkgen.model.fp8_gemm_table import SCALED_MM, gemm_choice, table_from_timings  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


BUCKETS = [
    {"max_m": 4, "kernel": "m16n64k128s4t"},
    {"max_m": 32, "kernel": SCALED_MM},
    {"max_m": 64, "kernel": "m64n64k128s2"},
]


def test_each_m_takes_the_bucket_of_the_next_measured_m_up(table):
    table({"48x64": BUCKETS})
    chosen = {m: gemm_choice(48, 64, m) for m in (1, 4, 5, 32, 33, 64, 65, 4096)}
    assert chosen == {
        1: CANDIDATES["m16n64k128s4t"],
        4: CANDIDATES["m16n64k128s4t"],
        5: None,
        32: None,
        33: CANDIDATES["m64n64k128s2"],
        64: CANDIDATES["m64n64k128s2"],
        65: None,  # past the measured rows: cuBLASLt
        4096: None,
    }
    assert gemm_choice(64, 48, 1) is None  # another shape


def test_without_a_table_every_shape_takes_scaled_mm(table):
    table(None)
    assert gemm_choice(4096, 4096, 1) is None and gemm_choice(48, 64, 1) is None


def test_a_table_naming_an_unknown_kernel_is_refused_with_the_fix(table):
    table({"48x64": [{"max_m": 4, "kernel": "m8n8k8"}]})
    with pytest.raises(ValueError, match="tune_fp8_mm.py --write-table"):
        gemm_choice(48, 64, 1)


class Calls:
    """Counts calls to the two GEMMs the dispatch chooses between, and runs them."""

    def __init__(self, monkeypatch):
        self.triton, self.cublas = [], 0
        real_gemm, real_mm = fp8_gemm_table.fp8_gemm, torch._scaled_mm

        def gemm(*args, **kwargs):
            self.triton.append(args[4])
            return real_gemm(*args, **kwargs)

        def scaled_mm(*args, **kwargs):
            self.cublas += 1
            return real_mm(*args, **kwargs)

        monkeypatch.setattr(fp8_gemm_table, "fp8_gemm", gemm)
        monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)


@pytest.mark.parametrize("bias, static", [(False, False), (True, False), (True, True)])
def test_fp8_linear_runs_the_kernel_the_table_names_for_its_rows(table, monkeypatch, bias, static):
    """Bias and a checkpoint's static input scale work the same on either GEMM."""
    table({"48x64": BUCKETS})
    linear = nn.Linear(64, 48, bias=bias, device=DEVICE, dtype=torch.bfloat16)
    fp8 = Fp8Linear.from_linear(linear)
    if static:
        fp8.input_scale = nn.Parameter(torch.tensor(0.02, device=DEVICE), requires_grad=False)
    calls = Calls(monkeypatch)
    x = torch.randn(3, 64, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        by_triton = fp8(x)
        assert calls.triton == [CANDIDATES["m16n64k128s4t"]] and calls.cublas == 0
        table(None)
        by_cublas = fp8(x)
    assert calls.triton == [CANDIDATES["m16n64k128s4t"]] and calls.cublas == 1
    assert by_triton.shape == by_cublas.shape == (3, 48)
    # Both round the same float32 sums once to bf16 (a bias adds one more bf16 rounding).
    assert torch.allclose(by_triton.float(), by_cublas.float(), rtol=2 * BF16_STEP, atol=1e-3)


def test_fp8_linear_takes_scaled_mm_at_rows_the_table_gives_it(table, monkeypatch):
    table({"48x64": BUCKETS})
    fp8 = Fp8Linear.from_linear(nn.Linear(64, 48, bias=False, device=DEVICE))
    calls = Calls(monkeypatch)
    with torch.no_grad():
        fp8(torch.randn(2, 8, 64, device=DEVICE))  # 16 rows: the scaled_mm bucket
        fp8(torch.randn(40, 64, device=DEVICE))  # 40 rows: m64n64k128s2
    assert calls.cublas == 1 and calls.triton == [CANDIDATES["m64n64k128s2"]]


def test_fp8_linear_keeps_zeroed_tile_counters_for_launches_that_add_their_own_splits(table):
    """Sized at its first call for the largest rows of any such bucket (so warm-up allocates
    them, before a graph is captured), and zero again after each call."""
    table({"48x64": [{"max_m": 16, "kernel": "m16n64k128s4tf"}, *BUCKETS[1:]]})
    assert fp8_gemm_table.tile_counters_needed(48, 64) == 1  # 16 rows x 48 columns: one tile
    fp8 = Fp8Linear.from_linear(nn.Linear(64, 48, bias=False, device=DEVICE))
    x = torch.randn(9, 64, device=DEVICE)
    with torch.no_grad():
        first = fp8(x)
        counters = fp8.tile_counters
        assert counters.numel() == 1 and not counters.any()
        assert torch.equal(fp8(x), first) and fp8.tile_counters is counters and not counters.any()
        fp8(torch.randn(40, 64, device=DEVICE))  # the m64n64k128s2 bucket: two launches
    table({"48x64": BUCKETS})
    assert fp8_gemm_table.tile_counters_needed(48, 64) == 0


def test_the_table_keeps_the_fastest_kernel_per_m_and_merges_neighbours():
    timings = {
        "4096x4096": {
            1: {SCALED_MM: 3.0, "a": 2.0, "b": 2.5},
            8: {SCALED_MM: 3.0, "a": 2.1, "b": 2.2},
            32: {SCALED_MM: 3.0, "a": 2.9, "b": 2.2},
            512: {SCALED_MM: 3.0, "a": 9.0, "b": 4.0},
        }
    }
    assert table_from_timings(timings) == {
        "4096x4096": [
            {"max_m": 8, "kernel": "a"},
            {"max_m": 32, "kernel": "b"},
            {"max_m": 512, "kernel": SCALED_MM},
        ]
    }


def test_the_shipped_table_reads_and_without_one_nothing_changes():
    """The package's own table, once the tuner wrote it, names only candidates (else reading it
    raises) in buckets of rising max_m; until then every 8B projection keeps _scaled_mm."""
    fp8_gemm_table.measured_choices.cache_clear()
    gemm_choice.cache_clear()
    try:
        shapes = fp8_gemm_table.measured_choices()
        if not fp8_gemm_table.TABLE_FILE.exists():
            assert shapes == {} and gemm_choice(4096, 4096, 32) is None
        for buckets in shapes.values():
            bounds = [b["max_m"] for b in buckets]
            assert bounds == sorted(set(bounds)) and all(isinstance(m, int) for m in bounds)
    finally:
        fp8_gemm_table.measured_choices.cache_clear()
        gemm_choice.cache_clear()


def test_the_tuner_skips_wrong_kernels_and_tables_the_fastest(table, monkeypatch, capsys):
    """scripts/tune_fp8_mm.py's logic on the CPU (its timings are the GPU's; here made up): a
    candidate whose output differs from _scaled_mm is never timed, let alone chosen."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import tune_fp8_mm

    made_up = {SCALED_MM: 10.0, "m16n64k128s4t": 5.0, "m16n64k128s2t": 4.0, "m64n64k128s2": 1.0}
    broken = "m16n64k128s2t"

    def graph_us(gemm, x, weights):
        if gemm is tune_fp8_mm.scaled_mm:
            return made_up[SCALED_MM]
        return made_up.get(names[gemm.keywords["config"]], 20.0)

    real_gemm = tune_fp8_mm.fp8_gemm

    def gemm(xq, x_scale, wq, w_scale, config, tile_counters=None, fast_accum=False):
        assert fast_accum is tune_fp8_mm.FAST_ACCUM  # timed as the engine sums by default
        out = real_gemm(xq, x_scale, wq, w_scale, config, tile_counters=tile_counters)
        return out * 2 if config == CANDIDATES[broken] else out

    names = {config: name for name, config in CANDIDATES.items()}
    monkeypatch.setattr(tune_fp8_mm, "graph_us", graph_us)
    monkeypatch.setattr(tune_fp8_mm, "fp8_gemm", gemm)
    timings = {"48x128": tune_fp8_mm.tune_projection("o", 48, 128, [1, 64], DEVICE)}
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["M"], line["best"]) for line in lines] == [
        (1, "m16n64k128s4t"),
        (64, "m64n64k128s2"),
    ]
    assert lines[0]["speedup"] == 2.0 and any(broken in r for r in lines[0]["refused"])
    assert broken not in lines[0]["us"] and "m64n64k128s2" not in lines[0]["us"]  # too tall at 1
    assert table_from_timings(timings)["48x128"] == [
        {"max_m": 1, "kernel": "m16n64k128s4t"},
        {"max_m": 64, "kernel": "m64n64k128s2"},
    ]


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("kernel", ["m16n64k128s4t", "m16n64k128s4tf"])
def test_gpu_fp8_linear_with_a_table_replays_the_chosen_kernel_in_a_graph(
    table, monkeypatch, kernel
):
    table({"4096x4096": [{"max_m": 32, "kernel": kernel}]})
    linear = nn.Linear(4096, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(32, 4096, device="cuda", dtype=torch.bfloat16)
    calls = Calls(monkeypatch)
    assert_replays_with_new_inputs(fp8, x)
    assert calls.cublas == 0 and len(calls.triton) == 3


def test_the_tuner_writes_the_table_the_dispatch_reads_and_a_step_summary(
    table, monkeypatch, capsys, tmp_path
):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import tune_fp8_mm

    def tune_projection(name, n, k, rows, dev):  # made-up seconds: Triton wins at 1 row only
        return {m: {SCALED_MM: 2e-5, "m16n64k128s4t": 1e-5 if m == 1 else 3e-5} for m in rows}

    path = tmp_path / "written_by_the_tuner.json"
    monkeypatch.setattr(tune_fp8_mm, "tune_projection", tune_projection)
    monkeypatch.setattr(tune_fp8_mm, "TABLE_FILE", path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "test GPU")
    monkeypatch.setattr("sys.argv", ["tune_fp8_mm.py", "--write-table", "--rows", "1,32"])
    tune_fp8_mm.main()
    summaries = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(s["M"], s["speedup"]) for s in summaries] == [(1, 2.0), (32, 1.0)]
    assert summaries[0]["scaled_mm_ms"] == round(4 * 32 * 2e-5 * 1000, 3)  # 4 GEMMs, 32 layers
    written = json.loads(path.read_text())
    assert written["device"] == "test GPU"
    table(written["shapes"])  # what the dispatch then reads
    assert gemm_choice(4096, 4096, 1) == CANDIDATES["m16n64k128s4t"]
    assert gemm_choice(28672, 4096, 1) == CANDIDATES["m16n64k128s4t"]
    assert gemm_choice(4096, 14336, 32) is None
