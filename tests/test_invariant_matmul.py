"""Batch-invariant GEMMs (issue 15): a row's result is the same bits alone or in any batch.

Without CUDA the Triton kernel runs under the interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order): that checks its indexing, masking and K loop against torch
and that no row reads another; the GPU-marked tests check the bits on the tensor cores.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bulkgen.model.invariant import invariant_linear, rowwise_linear  # noqa: E402
from bulkgen.model.invariant_matmul import (  # noqa: E402
    CANDIDATES,
    MatmulConfig,
    default_config,
    invariant_matmul,
)

SMALL = MatmulConfig(32, 16, 32)  # small tiles: several row and column tiles in the interpreter
SMALL_TMA = MatmulConfig(32, 16, 32, tma=True)
TILINGS = pytest.mark.parametrize("cfg", [SMALL, SMALL_TMA], ids=["pointers", "tma"])
DTYPES = (torch.float32, torch.bfloat16)
pytestmark = pytest.mark.usefixtures("rowwise_interpreted_dots")  # bits, not BLAS
BF16_STEP = 2.0**-7  # bfloat16 keeps 8 significant bits
# Llama-3-8B's projections and lm_head, (N, K).
LLAMA_8B = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def operands(m: int, n: int, k: int, dtype: torch.dtype, bias: bool = False, device="cpu"):
    x = torch.randn(m, k, device=device).to(dtype)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
    b = torch.randn(n, device=device).to(dtype) if bias else None
    return x, w, b


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The exact float64 result, as float32."""
    y = x.double() @ w.double().T + (0 if b is None else b.double())
    return y.float()


@TILINGS
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_torch_on_ragged_shapes(dtype, bias, cfg):
    # M, N and K are none of them a multiple of the tiles (37 rows, 50 columns, K = 104).
    x, w, b = operands(37, 50, 104, dtype, bias)
    y = invariant_matmul(x, w, b, cfg)
    assert y.shape == (37, 50) and y.dtype == dtype
    ref = reference(x, w, b)
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    else:  # float32 accumulation, one rounding to bfloat16: within one step (2**-7 of the value;
        # the interpreter's cast truncates where the GPU's rounds to nearest)
        torch.testing.assert_close(y.float(), ref, rtol=BF16_STEP, atol=1e-6)


def test_kernel_with_the_default_tiling_of_a_narrow_weight():
    x, w, b = operands(70, 96, 256, torch.bfloat16, bias=True)
    cfg = default_config(96, 256, torch.bfloat16)
    torch.testing.assert_close(
        invariant_matmul(x, w, b).float(), reference(x, w, b), rtol=BF16_STEP, atol=1e-6
    )
    assert cfg.block_m >= 64  # Hopper's wgmma needs 64-row tiles


@TILINGS
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_rows_are_the_same_bits_alone_in_any_batch_and_in_any_order(dtype, cfg):
    x, w, b = operands(70, 50, 104, dtype, bias=True)
    full = invariant_matmul(x, w, b, cfg)
    for m in (1, 5, 33, 64):  # fewer rows than a tile, one tile and a bit, whole tiles
        assert torch.equal(invariant_matmul(x[:m], w, b, cfg), full[:m])
    for r in (0, 17, 69):  # each at position 0 of its own tile, alone
        assert torch.equal(invariant_matmul(x[r : r + 1].clone(), w, b, cfg)[0], full[r])
    perm = torch.randperm(70)
    assert torch.equal(invariant_matmul(x[perm], w, b, cfg), full[perm])


@TILINGS
def test_kernel_reads_strided_and_unaligned_rows(cfg):
    x, w, _ = operands(40, 48, 64, torch.float32)
    wide = torch.randn(40, 3 * 64 + 1)
    wide[:, 65:129] = x  # a column slice: row stride 193, an address 4 bytes past alignment
    got = invariant_matmul(wide[:, 65:129], w, None, cfg)
    assert torch.equal(got, invariant_matmul(x, w, None, cfg))


def test_a_weight_the_tma_cannot_read_takes_the_pointer_kernel():
    x, w, _ = operands(37, 50, 100, torch.bfloat16)  # rows of 200 bytes: not 16-byte multiples
    assert torch.equal(invariant_matmul(x, w, None, SMALL_TMA), invariant_matmul(x, w, None, SMALL))


def test_kernel_refuses_mismatched_operands():
    x, w, _ = operands(4, 8, 32, torch.float32)
    with pytest.raises(ValueError, match="weight \\[N, K\\]"):
        invariant_matmul(x, w[:, :16])
    with pytest.raises(ValueError, match="bfloat16"):
        invariant_matmul(x, w.bfloat16())


def test_default_tiling_is_one_of_the_benchmarked_candidates_for_every_llama_shape():
    for n, k in LLAMA_8B.values():
        for dtype in (torch.bfloat16, torch.float16):
            assert default_config(n, k, dtype) in CANDIDATES.values()


def test_config_rejects_tiles_the_kernel_cannot_use():
    with pytest.raises(ValueError, match="power of two"):
        MatmulConfig(48, 64, 64)
    with pytest.raises(ValueError, match="block_k must be >= 16"):
        MatmulConfig(64, 64, 8)


def test_the_default_and_a_tma_tiling_compile_for_hopper():
    """The interpreter skips the GPU compiler, which rejects what it accepts: compile for sm_90
    in a process without TRITON_INTERPRET (no GPU needed). Every candidate:
    scripts/compile_check_invariant_mm.py with no arguments."""
    import subprocess
    import sys
    from pathlib import Path

    names = {
        n
        for n, c in CANDIDATES.items()
        for s in LLAMA_8B.values()
        if c == default_config(*s, torch.bfloat16)
    }
    # and the pointer-load tiling of the same shape (weights the TMA cannot read take it)
    names = sorted(names | {"m128n128k64t", "m128n128k64"}) + ["fp32_config"]
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    script = root / "scripts" / "compile_check_invariant_mm.py"
    command = [sys.executable, script, "--configs", ",".join(names)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("(fits)") == 4 * (len(names) - 1) + 2  # bf16 and fp16, fp32


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(64, 64), (384, 64), (1000, 999), (512, 4096), (8192, 600)])
def test_cpu_rows_are_the_same_bits_alone_in_any_batch_and_in_any_order(dtype, n, k):
    # torch's own F.linear on this CPU is not: in float32 a row alone and in a batch differ.
    # (8192, 600) is above CPU_CACHE_BYTES in both dtypes: read in slices of rows.
    x, w, b = operands(200, n, k, dtype, bias=True)
    full = rowwise_linear(x, w, b)
    for m in (1, 2, 7, 31, 64, 129):
        assert torch.equal(rowwise_linear(x[:m], w, b), full[:m])
    perm = torch.randperm(200)
    assert torch.equal(rowwise_linear(x[perm], w, b), full[perm])
    assert torch.equal(rowwise_linear(x[::3], w, b), full[::3])  # strided rows, other alignments
    torch.testing.assert_close(
        full, F.linear(x, w, b), rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-3
    )


def test_invariant_linear_keeps_leading_dims():
    x, w, b = operands(6, 24, 32, torch.float32, bias=True)
    y = invariant_linear(x.view(2, 3, 32), w, b)
    assert y.shape == (2, 3, 24)
    assert torch.equal(y.view(6, 24), rowwise_linear(x, w, b))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", LLAMA_8B)
def test_gpu_rows_are_the_same_bits_in_any_batch_for_llama_8b_shapes(shape):
    n, k = LLAMA_8B[shape]
    x, w, _ = operands(1000, n, k, torch.bfloat16, device="cuda")
    full = invariant_linear(x, w)
    for m in (1, 7, 64, 256):
        assert torch.equal(invariant_linear(x[:m], w), full[:m]), m
    for r in (0, 5, 63, 64, 300, 999):  # every position of a tile, each row also alone
        assert torch.equal(invariant_linear(x[r : r + 1].clone(), w)[0], full[r]), r
    perm = torch.randperm(1000, device="cuda")
    assert torch.equal(invariant_linear(x[perm], w), full[perm])
    # As accurate as cuBLAS: both against float32 products summed in float32.
    ref = F.linear(x[:256].float(), w.float())
    err = (full[:256].float() - ref).norm() / ref.norm()
    cublas = (F.linear(x[:256], w).float() - ref).norm() / ref.norm()
    assert err <= 1.5 * cublas + 1e-4, (err, cublas)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", CANDIDATES)
def test_gpu_every_candidate_tiling_is_invariant_and_accurate(name):
    cfg = CANDIDATES[name]
    x, w, b = operands(1000, *LLAMA_8B["o"], torch.bfloat16, bias=True, device="cuda")
    full = invariant_matmul(x, w, b, cfg)
    for m in (1, 7, 64, 256):
        assert torch.equal(invariant_matmul(x[:m], w, b, cfg), full[:m]), m
    for r in (5, 127, 999):
        assert torch.equal(invariant_matmul(x[r : r + 1].clone(), w, b, cfg)[0], full[r]), r
    ref = F.linear(x.float(), w.float(), b.float())
    assert ((full.float() - ref).norm() / ref.norm()).item() < 4e-3  # bf16 output rounding


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["library default", "m128n128k64t"])
def test_gpu_a_cuda_graph_replays_the_same_bits(name):
    # The engine replays decode steps from CUDA graphs: a TMA descriptor is captured by value.
    x, w, _ = operands(64, *LLAMA_8B["qkv"], torch.bfloat16, device="cuda")
    cfg = CANDIDATES.get(name)
    eager = invariant_matmul(x, w, None, cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = invariant_matmul(x, w, None, cfg)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, invariant_matmul(x, w, None, cfg))
    assert not torch.equal(out, eager)  # the replay read the new rows


def test_the_measured_table_sets_a_shapes_tiling_and_the_fallback_covers_the_rest(
    tmp_path, monkeypatch
):
    import bulkgen.model.invariant_matmul as mm

    table = tmp_path / "tilings.json"
    table.write_text('{"measured": "H200", "bfloat16": {"4096x4096": "m128n256k64"}}')
    monkeypatch.setattr(mm, "TILINGS_FILE", table)
    mm.measured_tilings.cache_clear()
    try:
        assert default_config(4096, 4096, torch.bfloat16) == CANDIDATES["m128n256k64"]
        assert default_config(4096, 4096, torch.float16) == CANDIDATES[mm.FALLBACK]
        assert default_config(128256, 4096, torch.bfloat16) == CANDIDATES[mm.FALLBACK]
    finally:
        mm.measured_tilings.cache_clear()
