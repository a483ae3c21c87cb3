"""The FP8 GEMM launched with programmatic dependent launch (bulkgen/model/pdl.py,
BULKGEN_FP8_PDL=1) behind the kernels that produce its input, which let it start early: the same
bits as without, eagerly and replayed in a CUDA graph with new inputs each time (a GEMM that read
its input before the producer finished would differ). GPU only (sm_90): on the CPU PDL is never
on, which the first test checks."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_fp8 import needs_fp8_gpu  # noqa: E402

from bulkgen.model import pdl  # noqa: E402
from bulkgen.model.fp8 import quantize_weight  # noqa: E402
from bulkgen.model.fp8_fused import rms_norm_fp8, silu_and_mul_fp8  # noqa: E402
from bulkgen.model.fp8_gemm import CANDIDATES, fp8_gemm, tile_counters_for  # noqa: E402
from bulkgen.model.fp8_kernels import quantize_rows  # noqa: E402


def test_pdl_is_never_on_for_the_cpu(monkeypatch):
    monkeypatch.setenv(pdl.ENV, "1")
    assert not pdl.enabled(torch.device("cpu")) and pdl.launch_options(torch.device("cpu")) == {}
    monkeypatch.setenv(pdl.ENV, "0")
    assert not pdl.enabled(torch.device("cuda"))


def producers(rows: int, k: int):
    """The three kinds of kernel that feed the 8B decoder's FP8 GEMMs, each its own input."""
    dev = torch.device("cuda")
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16) * 3
    gate_up = torch.randn(rows, 2 * k, device=dev, dtype=torch.bfloat16) * 3
    weight = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
    return {
        "rms_norm": (lambda: tuple(rms_norm_fp8(x, weight, 1e-5)), x),
        "quantize_rows": (lambda: quantize_rows(x), x),
        "silu_split": (lambda: tuple(silu_and_mul_fp8(gate_up, "split")), gate_up),
        "silu_one_pass": (lambda: tuple(silu_and_mul_fp8(gate_up, "one_pass")), gate_up),
    }


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("name", ["m16n64k128s4tf", "m16n64k256s2tfp3", "m32n64k128s2tf"])
@pytest.mark.parametrize("rows", [1, 32])
def test_gpu_a_gemm_launched_early_gives_the_same_bits(monkeypatch, name, rows):
    n, k = 6144, 4096
    config = CANDIDATES[name]
    dev = torch.device("cuda")
    wq, w_scale = quantize_weight(torch.randn(n, k, device=dev) / k**0.5)
    counters = tile_counters_for(rows, n, config, dev)
    for kind, (produce, source) in producers(rows, k).items():

        def step(produce=produce):
            xq, x_scale = produce()
            return fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters)

        monkeypatch.setenv(pdl.ENV, "0")
        expected = step().clone()
        monkeypatch.setenv(pdl.ENV, "1")
        assert pdl.enabled(dev)
        for _ in range(5):
            assert torch.equal(step(), expected), kind
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for _ in range(10):  # new inputs written before each replay: read after the producer
            source.copy_(torch.randn_like(source) * 3)
            monkeypatch.setenv(pdl.ENV, "0")
            want = step().clone()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want), kind
            monkeypatch.setenv(pdl.ENV, "1")
