"""gate_up's FP8 GEMM with the SiLU in its epilogue (fp8_gemm_silu.py, on unless
BULKGEN_FP8_SILU_GEMM=0) gives down the same FP8 rows and scales as the GEMM followed by
silu_and_mul_fp8, runs only where the table chose a launch it can take, and compiles for sm_90.

Without CUDA the kernels run under the Triton interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order).
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_fp8 import DEVICE, needs_fp8_gpu  # noqa: E402
from test_fp8_gemm import operands  # noqa: E402

from bulkgen.model import fp8_gemm_silu  # noqa: E402
from bulkgen.model.fp8 import Fp8Activation, Fp8Linear, fuse_input_quantization  # noqa: E402
from bulkgen.model.fp8_fused import silu_and_mul_fp8  # noqa: E402
from bulkgen.model.fp8_gemm import CANDIDATES, fp8_gemm  # noqa: E402
from bulkgen.model.fp8_gemm_silu import (  # noqa: E402
    fused_config,
    fused_rows,
    gate_up_silu,
    gate_up_silu_rows,
)
from bulkgen.model.fp8_gemm_table import SCALED_MM  # noqa: E402
from bulkgen.model.fused import silu_and_mul  # noqa: E402
from bulkgen.model.switches import SILU_GEMM_ENV, apply_switches  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def unfused(xq, x_scale, wq, w_scale, config):
    """gate_up by fp8_gemm with the same tiles, then the stash form of silu_and_mul_fp8."""
    gate_up = fp8_gemm(xq, x_scale, wq, w_scale, config)
    return gate_up, silu_and_mul_fp8(gate_up, form="stash")


@pytest.mark.parametrize(
    "name, m, i, k",
    [
        ("m16n64k128s1t", 5, 96, 256),  # swapped; I not a whole number of tiles
        ("m32n64k128s1t", 32, 128, 160),  # K not a whole number of tiles
        ("m64n128k128s1", 3, 64, 128),  # not swapped
    ],
)
def test_the_fused_rows_are_the_gemm_then_silu_bit_for_bit(name, m, i, k):
    config = CANDIDATES[name]
    xq, x_scale, wq, w_scale = operands(m, 2 * i, k)
    h, absmax = gate_up_silu_rows(Fp8Activation(xq, x_scale), wq, w_scale, config)
    gate_up, ref = unfused(xq, x_scale, wq, w_scale, config)
    assert torch.equal(h, silu_and_mul(gate_up))
    tiles = -(-i // config.block_n)
    assert absmax.shape == (m, tiles)
    assert torch.equal(absmax.amax(dim=1), h.float().abs().amax(dim=1))
    out = Fp8Activation(torch.empty_like(ref.q), torch.empty_like(ref.scale))
    from bulkgen.model.fp8_silu_split import quantize_stashed

    quantize_stashed(h, absmax, out.q, out.scale)
    assert torch.equal(out.q.view(torch.uint8), ref.q.view(torch.uint8))
    assert torch.equal(out.scale, ref.scale)


def test_the_fused_launch_follows_the_tables_choice_for_gate_up(table):
    table(
        {
            "256x64": [
                {"max_m": 8, "kernel": "m16n64k128s1t"},
                {"max_m": 16, "kernel": "m16n64k256s2tf"},
                {"max_m": 32, "kernel": "m32n128k128s1td"},
                {"max_m": 64, "kernel": SCALED_MM},
            ]
        }
    )
    assert fused_config(256, 64, 8) == CANDIDATES["m16n64k128s1t"]  # 64 wide: kept
    assert fused_config(256, 64, 16) is None  # K split: not fused
    tma = CANDIDATES["m32n128k128s1td"]  # through pointers, half as wide
    assert fused_config(256, 64, 32) == dataclasses.replace(tma, block_n=64, tma=False)
    assert fused_config(256, 64, 64) is None  # cuBLASLt
    assert fused_config(256, 64, 65) is None  # past the table


def set_switch(monkeypatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(SILU_GEMM_ENV, raising=False)
    else:
        monkeypatch.setenv(SILU_GEMM_ENV, value)


def fp8_gate_up(i: int, k: int, bias: bool = False) -> Fp8Linear:
    linear = torch.nn.Linear(k, 2 * i, bias=bias, device=DEVICE, dtype=torch.bfloat16)
    return Fp8Linear.from_linear(linear)


@pytest.mark.parametrize("switch", ["0", "1", None])  # None: unset, the default (on)
def test_gate_up_silu_fuses_only_when_on_with_the_same_rows(table, monkeypatch, switch):
    table({"128x64": [{"max_m": 8, "kernel": "m16n64k128s1t"}]})
    set_switch(monkeypatch, switch)
    on = switch != "0"
    launches = []
    real = fp8_gemm_silu.gate_up_silu_rows
    monkeypatch.setattr(
        fp8_gemm_silu, "gate_up_silu_rows", lambda *a, **kw: launches.append(1) or real(*a, **kw)
    )
    linear = fp8_gate_up(64, 64)
    xq, x_scale, _, _ = operands(6, 128, 64)
    x = Fp8Activation(xq, x_scale)
    out = gate_up_silu(linear, x)
    ref = silu_and_mul_fp8(linear(x), "stash")  # unfused by default: rows_fast (approximate)
    assert len(launches) == on
    assert torch.equal(out.q.view(torch.uint8), ref.q.view(torch.uint8))
    assert torch.equal(out.scale, ref.scale)


def test_gate_up_silu_keeps_the_two_ops_where_it_cannot_fuse(table, monkeypatch):
    table({"128x64": [{"max_m": 8, "kernel": "m16n64k128s1t"}]})
    monkeypatch.setenv(SILU_GEMM_ENV, "1")
    monkeypatch.setattr(fp8_gemm_silu, "gate_up_silu_rows", None)  # any call would fail
    xq, x_scale, _, _ = operands(6, 128, 64)
    with_bias = fp8_gate_up(64, 64, bias=True)
    x = Fp8Activation(xq, x_scale)
    assert torch.equal(gate_up_silu(with_bias, x).scale, silu_and_mul_fp8(with_bias(x)).scale)
    plain = fp8_gate_up(64, 64)
    rows = torch.randn(6, 64, dtype=torch.bfloat16, device=DEVICE)  # not yet in FP8
    assert torch.equal(gate_up_silu(plain, rows).scale, silu_and_mul_fp8(plain(rows)).scale)
    many = Fp8Activation(*operands(9, 128, 64)[:2])  # 9 rows: past the table, cuBLASLt
    assert torch.equal(gate_up_silu(plain, many).scale, silu_and_mul_fp8(plain(many)).scale)


def test_a_bad_switch_value_fails_the_models_load(monkeypatch):
    monkeypatch.setenv(SILU_GEMM_ENV, "yes")
    with pytest.raises(ValueError, match="BULKGEN_FP8_SILU_GEMM must be 1 or 0"):
        apply_switches(torch.device("cpu"))


def test_the_fused_kernel_compiles_for_sm_90_to_e4m3_wgmma():
    """Both weight tiles of a K step reach the tensor cores as e4m3 (swapped 32-row tile, as the
    table's gate_up launch at 32 rows), pipelined through cp.async; no local-memory spills."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    script = root / "scripts" / "compile_check_fp8_gemm.py"
    done = subprocess.run(
        [sys.executable, script, "--silu", "m32n128k128s1td"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("silu m32n64k128s1t: ") and "mma wgmma." in line, line
    assert ".e4m3.e4m3" in line and "0 local loads" in line, line
    copies = int(line.split(" async copies")[0].rsplit(" ", 1)[-1])
    assert copies >= 3, line  # x and the gate and up tiles of a K step


@needs_fp8_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 32, 64])
def test_gpu_fused_rows_match_the_unfused_ops_on_the_8b_gate_up(m):
    """On the GPU at the 8B gate_up shape, each launch fused_config derives from the shipped
    table: the same e4m3 rows as the GEMM with the same tiles then the SiLU, and in a CUDA graph
    with new inputs."""
    config = fused_config(28672, 4096, m)
    if config is None:
        pytest.skip(f"the table fuses nothing at {m} rows")
    xq, x_scale, wq, w_scale = operands(m, 28672, 4096)
    _, ref = unfused(xq, x_scale, wq, w_scale, config)
    x = Fp8Activation(xq, x_scale)

    def fused():
        return fused_rows(x, wq, w_scale, config)

    out = fused()
    assert torch.equal(out.q.view(torch.uint8), ref.q.view(torch.uint8))
    assert torch.equal(out.scale, ref.scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = fused()
    xq.copy_(operands(m, 28672, 4096)[0])
    graph.replay()
    _, ref = unfused(xq, x_scale, wq, w_scale, config)
    assert torch.equal(replayed.q.view(torch.uint8), ref.q.view(torch.uint8))


@pytest.mark.parametrize("switch", ["0", "1", None])
def test_a_model_with_the_fused_silu_computes_what_it_did_without(
    tiny_model_dir,
    table,
    monkeypatch,
    switch,
):
    from fp8_checkpoints import load, logits

    model = load(tiny_model_dir, quantization="fp8")
    fuse_input_quantization(model)
    gate_up = model.model.layers[0].mlp.gate_up_proj
    assert gate_up.use_scaled_mm  # the tiny model's widths take the table
    shape = f"{gate_up.out_features}x{gate_up.in_features}"
    table({shape: [{"max_m": 64, "kernel": "m16n64k128s1t"}]})
    ids = list(range(5, 30))
    monkeypatch.setenv(SILU_GEMM_ENV, "0")
    monkeypatch.setenv("BULKGEN_SILU_FORM", "stash")  # the fused SiLU's bits (not rows_fast's)
    unfused = logits(model, ids)
    set_switch(monkeypatch, switch)
    launches = []
    real = fp8_gemm_silu.gate_up_silu_rows
    monkeypatch.setattr(
        fp8_gemm_silu, "gate_up_silu_rows", lambda *a, **kw: launches.append(1) or real(*a, **kw)
    )
    assert torch.equal(logits(model, ids), unfused)
    assert len(launches) == (len(model.model.layers) if switch != "0" else 0)


def test_the_fused_launch_follows_the_tables_silu_choices_where_measured(table):
    gemm = [{"max_m": 64, "kernel": "m16n64k128s1t"}]
    silu = [
        {"max_m": 8, "kernel": "m16n128k128s1t"},
        {"max_m": 16, "kernel": "unfused"},
        {"max_m": 32, "kernel": "m32n64k128s1t"},
    ]
    table({"256x64": gemm, "512x64": gemm}, silu={"256x64": silu})
    assert fused_config(256, 64, 8) == CANDIDATES["m16n128k128s1t"]  # as tuned, not halved
    assert fused_config(256, 64, 16) is None  # the unfused pair measured faster
    assert fused_config(256, 64, 32) == CANDIDATES["m32n64k128s1t"]
    assert fused_config(256, 64, 33) is None  # past the tuned rows
    assert fused_config(512, 64, 33) == CANDIDATES["m16n64k128s1t"]  # not tuned: derived


@pytest.mark.parametrize("kernel", ["m16n64k256s2tf", "m16n64k128s1td", "nonesuch"])
def test_a_silu_choice_the_fused_kernel_cannot_run_is_refused(table, kernel):
    table({}, silu={"256x64": [{"max_m": 8, "kernel": kernel}]})
    with pytest.raises(ValueError, match="bench_silu_gemm.py --tune"):
        fused_config(256, 64, 8)
