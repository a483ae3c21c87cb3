"""The Triton FP8 GEMM (fp8_gemm.py) computes what torch._scaled_mm computes, with every
candidate launch, and compiles for Hopper as intended (test_fp8_gemm_table.py: where it runs).

Without CUDA the kernel runs under the Triton interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order), which runs tl.dot on e4m3 tiles too; the sm_90 compile
check and the GPU-marked tests cover what only the GPU compiler and the H200 can.
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_fp8 import DEVICE, needs_fp8_gpu  # noqa: E402

from bulkgen.model.fp8 import (  # noqa: E402
    quantize_rows_reference,
    quantize_weight,
    scaled_mm_reference,
)
from bulkgen.model.fp8_gemm import (  # noqa: E402
    CANDIDATES,
    Fp8GemmConfig,
    fp8_gemm,
    tile_counters_for,
)
from bulkgen.model.fp8_gemm_tma import tma_launch  # noqa: E402

# bf16 keeps 8 significant bits: a value's step is at most 2**-7 of it. The GPU rounds to nearest
# (within half a step); the interpreter's cast to bf16 truncates (within one step).
BF16_STEP = 2.0**-7
# float32 sums of up to 14336 products taken in other orders (tensor cores, K splits) differ by
# far less than this fraction of the largest output; a kernel that drops a K tile is far above.
SUM_ORDER = 1e-4


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def gemm(xq, x_scale, wq, w_scale, config):
    """fp8_gemm with fresh tile counters where the launch adds its own K splits."""
    counters = tile_counters_for(xq.shape[0], wq.shape[0], config, xq.device)
    return fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters)


def operands(m: int, n: int, k: int, device=DEVICE):
    """Per-row fp8 activations and per-channel fp8 weights, scales spread over 16x."""
    x = torch.randn(m, k, device=device) * torch.logspace(0, 1.2, m, device=device)[:, None]
    w = torch.randn(n, k, device=device) * torch.logspace(-1, 0.2, n, device=device)[:, None]
    return (*quantize_rows_reference(x), *quantize_weight(w))


def assert_rounds_like_the_reference(out: torch.Tensor, ref: torch.Tensor) -> None:
    """out is ref cast once to bf16, up to float32 sums taken in another order."""
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    err = (out.float() - ref).abs()
    assert (err <= BF16_STEP * ref.abs() + SUM_ORDER * ref.abs().max()).all(), err.max()


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_every_candidate_equals_the_reference_on_ragged_shapes(name):
    """M, N and K that fill no tile (masked rows, modulo columns, zeros past K), and split-K
    over a K of several tiles: 300 = 2 * 128 + 44."""
    xq, x_scale, wq, w_scale = operands(37, 80, 300)
    out = gemm(xq, x_scale, wq, w_scale, CANDIDATES[name])
    assert_rounds_like_the_reference(out, scaled_mm_reference(xq, x_scale, wq, w_scale))


@pytest.mark.parametrize("name", sorted(name for name, c in CANDIDATES.items() if c.tma))
def test_tma_launches_give_the_bits_of_the_same_launch_by_pointers(name):
    """Rows, columns and K that fill no tile, which the TMA reads as zeros (K = 320 = 2 * 128 +
    64, rows of 16-byte multiples), give the pointer kernel's bits with the same config; operands
    the TMA cannot read (300-byte rows) take the pointer kernel."""
    config = CANDIDATES[name]
    xq, x_scale, wq, w_scale = operands(37, 80, 320)
    assert tma_launch(xq, wq, config) is not None
    out = gemm(xq, x_scale, wq, w_scale, config)
    pointers = gemm(xq, x_scale, wq, w_scale, dataclasses.replace(config, tma=False))
    assert torch.equal(out, pointers)
    assert_rounds_like_the_reference(out, scaled_mm_reference(xq, x_scale, wq, w_scale))
    unaligned = operands(5, 80, 300)
    assert tma_launch(unaligned[0], unaligned[2], config) is None


@pytest.mark.parametrize("split_k", [1, 2, 4, 8])
@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("fixup", [False, True])
@pytest.mark.parametrize("m, n, k", [(1, 16, 16), (3, 48, 112), (16, 64, 64), (20, 33, 176)])
def test_small_tiles_split_k_ways_equal_the_reference(split_k, swap_ab, fixup, m, n, k):
    """More splits than K tiles leave some splits empty; each still writes its zeros."""
    config = Fp8GemmConfig(16, 16, 32, split_k, swap_ab=swap_ab, fixup=fixup)
    xq, x_scale, wq, w_scale = operands(m, n, k)
    out = gemm(xq, x_scale, wq, w_scale, config)
    assert_rounds_like_the_reference(out, scaled_mm_reference(xq, x_scale, wq, w_scale))


def test_a_launch_adding_its_own_splits_leaves_its_counters_zero_for_the_next():
    """The last split of each output tile adds the partials in split order and zeroes the
    tile's count: the same counters serve call after call, with the same bits as a first call,
    and the sums agree with the two-launch reduction up to the order of four float32 adds."""
    xq, x_scale, wq, w_scale = operands(37, 80, 300)
    config = Fp8GemmConfig(16, 16, 32, 4, swap_ab=True, fixup=True)
    counters = tile_counters_for(37, 80, config, DEVICE)
    assert counters.numel() == 3 * 5  # row tiles x column tiles
    first = fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters)
    assert not counters.any()
    again = fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters)
    assert torch.equal(first, again) and not counters.any()
    two_launches = gemm(xq, x_scale, wq, w_scale, Fp8GemmConfig(16, 16, 32, 4, swap_ab=True))
    assert_rounds_like_the_reference(first, two_launches.float())
    with pytest.raises(ValueError, match="needs 15 tile counters"):
        fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters[:14])


def test_the_reference_check_fails_a_kernel_that_drops_a_split():
    """The comparison above can fail: the sum over one split of two is far off."""
    xq, x_scale, wq, w_scale = operands(4, 32, 64)
    half = fp8_gemm(xq[:, :32], x_scale, wq[:, :32], w_scale, Fp8GemmConfig(16, 16, 32))
    with pytest.raises(AssertionError):
        assert_rounds_like_the_reference(half, scaled_mm_reference(xq, x_scale, wq, w_scale))


def test_operands_of_any_strides_give_the_same_product():
    """Rows strided in memory (a slice of wider rows) and a transposed view are read right."""
    xq, x_scale, wq, w_scale = operands(5, 48, 96)
    config = CANDIDATES["m16n64k128s2t"]
    wide = torch.zeros(5, 160, dtype=xq.dtype, device=DEVICE)
    wide[:, 32:128] = xq
    by_columns = wq.t().contiguous().t()  # the same values, K not contiguous
    expected = fp8_gemm(xq, x_scale, wq, w_scale, config)
    assert torch.equal(fp8_gemm(wide[:, 32:128], x_scale, by_columns, w_scale, config), expected)
    tma = CANDIDATES["m16n64k128s1td"]  # a descriptor with the slice's 160-byte row stride
    assert tma_launch(wide[:, 32:128], wq, tma) is not None
    assert torch.equal(fp8_gemm(wide[:, 32:128], x_scale, wq, w_scale, tma), expected)


def test_no_rows_give_an_empty_output():
    xq, x_scale, wq, w_scale = operands(2, 32, 64)
    out = gemm(xq[:0], x_scale[:0], wq, w_scale, CANDIDATES["m16n64k128s4t"])
    assert out.shape == (0, 32) and out.dtype == torch.bfloat16


def test_configs_refuse_tiles_the_kernel_cannot_run():
    with pytest.raises(ValueError, match="power of two"):
        Fp8GemmConfig(16, 48, 64)
    with pytest.raises(ValueError, match=">= 16"):
        Fp8GemmConfig(8, 64, 64)
    with pytest.raises(ValueError, match="block_k >= 32"):
        Fp8GemmConfig(16, 64, 16)
    with pytest.raises(ValueError, match="dot"):
        Fp8GemmConfig(16, 64, 64, dot="int8")
    with pytest.raises(ValueError, match="tma"):  # wider than the TMA's 128-byte swizzle
        Fp8GemmConfig(16, 64, 256, tma=True)
    with pytest.raises(ValueError, match="tma"):
        Fp8GemmConfig(16, 64, 128, dot="fp16", tma=True)


def test_every_candidate_compiles_for_hopper_with_fp8_mma_where_intended():
    """The interpreter skips the GPU compiler: compile each launch for sm_90 in a process without
    TRITON_INTERPRET (no GPU needed). Swapped tiles and 64-row tiles multiply e4m3 operands in
    wgmma, with no conversion; "h" widens them to fp16 in registers first; a 16-row tile that is
    not swapped is widened by Triton itself (mma.sync has no e4m3 form it uses here). Every one
    pipelines its loads (cp.async), and fp8 MMAs hand their sums to float32 adds (precise
    accumulation, as _scaled_mm without fast accumulation)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    script = root / "scripts" / "compile_check_fp8_gemm.py"
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = re.findall(
        r"^(\w+) *:.* mma (\S+), (\d+) e4m3 conversions, (\d+) async copies, (\d+) f32 adds, "
        r"(\d+) acq_rel atomics$",
        done.stdout,
        re.M,
    )
    found = {name: (mma, *map(int, counts)) for name, mma, *counts in lines}
    fast = {name.removesuffix("_fast"): found.pop(name) for name in list(found) if "_fast" in name}
    assert set(found) == set(CANDIDATES) and "reduce" in done.stdout
    # Launched with PDL: each thread's weight lines of 2 K tiles asked of L2 before one wait.
    pattern = r"^pdl (\w+): (\d+) L2 prefetches, (\d+) grid waits$"
    pdl = {name: (int(p), int(w)) for name, p, w in re.findall(pattern, done.stdout, re.M)}
    assert set(pdl) == {"m16n64k128s4tf", "m16n64k256s2tfp3"}
    for prefetches, waits in pdl.values():
        assert prefetches >= 2 and waits == 1, (prefetches, waits)
    # TMA launches (fp8_gemm_tma.py): every tile by a bulk tensor copy, none by a thread's.
    pattern = r"^tma (\w+): (\d+) bulk tensor copies, (\d+) thread copies$"
    tma = {name: (int(b), int(t)) for name, b, t in re.findall(pattern, done.stdout, re.M)}
    assert set(tma) == {name for name, config in CANDIDATES.items() if config.tma}
    for name, (bulk, thread) in tma.items():
        assert bulk >= 2 and thread == 0, (name, bulk, thread)
    # Fast accumulation (fp8_fast_accum): the same MMAs, and e4m3 ones keep their sums in the
    # tensor cores' accumulator (no float32 adds; these samples do not add their own splits).
    assert set(fast) == {"m64n64k128s2", "m16n64k128s4t", "m16n64k128s4"}
    for name, (mma, _conversions, _copies, adds, atomics) in fast.items():
        assert mma == found[name][0] and atomics == 0, name
        if mma.endswith("e4m3.e4m3"):
            assert adds == 0 < found[name][3], (name, adds)
        else:  # widened to fp16: its MMA sums in float32 whatever the flag
            assert adds == found[name][3], name
    for name, (mma, conversions, copies, adds, atomics) in found.items():
        config = CANDIDATES[name]
        # One tile count a program, where it adds its own splits; none otherwise.
        assert atomics == (1 if config.fixup else 0), (name, atomics)
        if config.dot == "fp16" or (config.block_m < 64 and not config.swap_ab):
            assert mma.endswith("f16.f16") and conversions > 0, (name, mma)
        else:
            assert mma.startswith("wgmma") and mma.endswith("e4m3.e4m3"), (name, mma)
            assert conversions == 0 and adds > 0, name  # sums promoted to float32
        assert copies > 0, name


# ---- GPU only: the 8B shapes against cuBLASLt, and CUDA graphs ---------------------------------

SHAPES_8B = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("m", [1, 32, 128])
@pytest.mark.parametrize("shape", sorted(SHAPES_8B))
def test_gpu_every_candidate_equals_scaled_mm_on_the_8b_shapes(m, shape):
    n, k = SHAPES_8B[shape]
    xq, x_scale, wq, w_scale = operands(m, n, k)
    ref = scaled_mm_reference(xq, x_scale, wq, w_scale)
    cublas = torch._scaled_mm(
        xq, wq.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=torch.bfloat16
    )
    assert_rounds_like_the_reference(cublas, ref)  # the yardstick holds for cuBLASLt itself
    for name, config in CANDIDATES.items():
        out = gemm(xq, x_scale, wq, w_scale, config)
        assert_rounds_like_the_reference(out, ref)
        # Two roundings of float32 sums taken in different orders: a step apart at most.
        tol = BF16_STEP * cublas.float().abs() + SUM_ORDER * cublas.float().abs().max()
        assert ((out.float() - cublas.float()).abs() <= tol).all(), name


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize(
    "name",
    ["m16n64k128s1t", "m16n64k128s4t", "m64n64k128s2", "m16n64k128s4tf", "m64n64k128s2f"]
    + ["m16n64k128s1td", "m16n64k128s4tfd"],  # TMA descriptors captured by value
)
def test_gpu_fp8_gemm_replays_in_a_cuda_graph_with_new_inputs(name):
    """Split-K's partial buffer is allocated inside the capture (the graph's pool) and both
    launches replay; nothing reads data on the host."""
    xq, x_scale, wq, w_scale = operands(32, 4096, 4096)
    config = CANDIDATES[name]
    # Counters (for a launch adding its own splits) outlive the capture, as a layer's do.
    counters = tile_counters_for(32, 4096, config, xq.device)
    fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters)  # compile outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters)
    for _ in range(3):
        new_xq, new_scale, _, _ = operands(32, 4096, 4096)
        xq.copy_(new_xq)
        x_scale.copy_(new_scale)
        graph.replay()
        assert torch.equal(out, fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters))
        assert counters is None or not counters.any()
