"""FP8 weights: the quantize/dequantize arithmetic, the activation quantizer kernel and the FP8
linear against the float linear it replaces.

Without CUDA the Triton kernel runs under the interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order) and torch._scaled_mm runs on the CPU, so the arithmetic is
checked here; the GPU-marked tests check cuBLASLt's FP8 GEMM and CUDA-graph replay.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from torch import nn  # noqa: E402

from bulkgen.model.fp8 import (  # noqa: E402
    FP8,
    FP8_MAX,
    Fp8Linear,
    quantize_rows_reference,
    quantize_weight,
    scaled_mm_reference,
)
from bulkgen.model.fp8_kernels import quantize_rows  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_fp8_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with FP8 (compute capability 8.9+)",
)
# e4m3 keeps 3 mantissa bits: a value rounds by at most 2**-4 of itself (half a step of 2**-3).
E4M3_RELATIVE_STEP = 2.0**-4


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def test_weight_scales_are_per_output_channel_and_use_the_full_fp8_range():
    w = torch.randn(32, 64) * torch.logspace(-3, 2, 32)[:, None]  # rows 5 decades apart
    q, scale = quantize_weight(w)
    assert q.dtype == FP8 and q.shape == w.shape and scale.shape == (32,)
    assert torch.allclose(scale, w.abs().amax(dim=1) / FP8_MAX)
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((32,), FP8_MAX))


def test_weight_round_trip_error_is_within_half_an_e4m3_step_of_each_value():
    w = torch.randn(64, 128) * torch.logspace(-3, 2, 64)[:, None]
    q, scale = quantize_weight(w)
    back = q.float() * scale[:, None]
    # Normal e4m3 values round by at most 2**-4 of themselves; the smallest (subnormal, below
    # 2**-6 of the scale) by at most half their step 2**-9.
    bound = torch.maximum(w.abs() * E4M3_RELATIVE_STEP, scale[:, None] * 2.0**-10)
    assert ((back - w).abs() <= bound * 1.0001).all()
    assert relative_error(back, w) < 0.03


def test_activation_rows_get_their_own_scale_and_zero_rows_stay_zero():
    x = torch.randn(4, 64)
    x[1] *= 1000
    x[2] = 0
    q, scale = quantize_rows_reference(x)
    assert scale.shape == (4, 1) and scale.dtype == torch.float32
    assert torch.allclose(scale[[0, 1, 3], 0], x[[0, 1, 3]].abs().amax(dim=1) / FP8_MAX)
    assert torch.equal(q[2].float(), torch.zeros(64)) and torch.isfinite(scale).all()
    assert relative_error(q.float() * scale, x) < 0.03


def test_a_static_input_scale_is_used_for_every_row_and_clips_what_exceeds_it():
    x = torch.tensor([[1.0, -2.0, 1000.0], [0.5, 0.25, -1000.0]])
    q, scale = quantize_rows_reference(x, torch.tensor(2.0 / FP8_MAX))
    assert torch.equal(scale, torch.full((2, 1), 2.0 / FP8_MAX))
    assert torch.equal((q.float() * scale)[:, 2], torch.tensor([2.0, -2.0]))  # clipped
    assert torch.allclose(q.float() * scale, x.clamp(-2, 2), rtol=E4M3_RELATIVE_STEP)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 100, 4096, 5000])  # one block, masked, two loops
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("one_pass", [False, True])
def test_triton_activation_quantizer_equals_the_torch_reference_bit_for_bit(
    dtype, width, static, one_pass
):
    x = (torch.randn(6, width) * 3).to(dtype)
    x[2] = 0
    x[3, :6] = torch.tensor([1e-3, -1e-4, 1e-6, 0.5, -7.0, 9.0]) * x[3].abs().max()
    static_scale = torch.tensor(0.01) if static else None
    q, scale = quantize_rows(
        x.to(DEVICE), None if static_scale is None else static_scale.to(DEVICE), one_pass
    )
    ref_q, ref_scale = quantize_rows_reference(x, static_scale)
    assert torch.equal(scale.cpu(), ref_scale)
    assert torch.equal(q.cpu().view(torch.uint8), ref_q.view(torch.uint8))


def test_triton_quantizer_rounds_every_e4m3_value_and_midpoint_to_nearest_even():
    x = every_e4m3_value_and_midpoint()
    one = torch.tensor(1.0, device=DEVICE)
    q, _ = quantize_rows(x.to(DEVICE), one)
    ref_q, _ = quantize_rows_reference(x, one.cpu())
    assert torch.equal(q.cpu().view(torch.uint8), ref_q.view(torch.uint8))


def test_scaled_mm_on_fp8_operands_equals_the_dequantized_product():
    xq, x_scale = quantize_rows_reference(torch.randn(8, 64))
    wq, w_scale = quantize_weight(torch.randn(48, 64))
    expected = (xq.float() * x_scale) @ (wq.float() * w_scale[:, None]).t()
    reference = scaled_mm_reference(xq, x_scale, wq, w_scale)
    assert torch.allclose(reference, expected, rtol=1e-5, atol=1e-5)
    got = torch._scaled_mm(
        xq, wq.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=torch.float32
    )
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(64, 128), (40, 24)])  # _scaled_mm, and the reference path
def test_fp8_linear_output_is_close_to_the_float_linear(bias, shape):
    linear = nn.Linear(*shape, bias=bias)
    fp8 = Fp8Linear.from_linear(linear)
    assert fp8.weight.dtype == FP8 and fp8.use_scaled_mm == (shape == (64, 128))
    x = torch.randn(3, 5, shape[0])  # leading dims are kept
    with torch.no_grad():
        out, ref = fp8(x), linear(x)
    assert out.shape == ref.shape and out.dtype == x.dtype
    # Each operand rounds by <= 2**-4 of itself (about 2.5% rms): about 3.5% on the output.
    assert relative_error(out, ref) < 0.06


def test_fp8_linear_with_bad_scales_is_far_from_the_float_linear():
    """The closeness above is a real check: a wrong scale fails it."""
    linear = nn.Linear(64, 128, bias=False)
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(4, 64)
    with torch.no_grad():
        assert relative_error(fp8(x), linear(x)) < 0.06
        fp8.weight_scale.data[:64] *= 1.5  # the first half of the rows a part's scale off
        assert relative_error(fp8(x), linear(x)) > 0.2


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("rows", [1, 7, 256])
def test_fp8_linear_on_cuda_matches_the_reference_arithmetic(rows):
    linear = nn.Linear(4096, 1024, bias=False, device="cuda", dtype=torch.bfloat16)
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        out = fp8(x)
        xq, x_scale = quantize_rows_reference(x)
        ref = scaled_mm_reference(xq, x_scale, fp8.weight, fp8.weight_scale)
        assert relative_error(out, ref) < 0.01  # cuBLASLt vs float32: bf16 output rounding
        assert relative_error(out, linear(x)) < 0.06


@pytest.mark.gpu
@needs_fp8_gpu
def test_fp8_linear_replays_in_a_cuda_graph_with_new_inputs():
    linear = nn.Linear(256, 512, bias=False, device="cuda", dtype=torch.bfloat16)
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    assert_replays_with_new_inputs(fp8, x)


def assert_replays_with_new_inputs(fp8: nn.Module, x: torch.Tensor) -> None:
    """fp8(x) captured in a CUDA graph gives, replayed after x changes in place, what an eager
    call on the new x gives."""
    with torch.no_grad():
        fp8(x)  # compile the kernel outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fp8(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, fp8(x))


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("width", [576, 4096, 14336])
def test_triton_quantizer_on_cuda_equals_torch_bit_for_bit(width):
    x = (torch.randn(256, width, device="cuda") * 3).to(torch.bfloat16)
    x[7] = 0
    for static_scale in (None, torch.tensor(0.02, device="cuda")):
        ref_q, ref_scale = quantize_rows_reference(x, static_scale)
        for one_pass in (False, True):
            q, scale = quantize_rows(x, static_scale, one_pass)
            assert torch.equal(scale, ref_scale)
            assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


def every_e4m3_value_and_midpoint() -> torch.Tensor:
    """[1, N]: every finite e4m3 value, the midpoints between neighbours (ties: to the even one),
    and values just above and below each midpoint."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    values = values[values.isfinite()].sort().values
    middle = (values[1:] + values[:-1]) / 2
    return torch.cat([values, middle, middle * 1.001, middle * 0.999, values * 2]).reshape(1, -1)


def test_the_rounding_is_left_to_the_cast_only_on_a_gpu(monkeypatch):
    from bulkgen.model import fp8_kernels

    monkeypatch.delenv("BULKGEN_FP8_HW_ROUNDING", raising=False)
    monkeypatch.setattr(fp8_kernels, "HW_ROUNDING", True)
    assert not fp8_kernels.hw_rounding(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter's cast truncates
    assert not fp8_kernels.hw_rounding(torch.device("cuda"))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert fp8_kernels.hw_rounding(torch.device("cuda"))
    monkeypatch.setattr(fp8_kernels, "HW_ROUNDING", False)
    assert not fp8_kernels.hw_rounding(torch.device("cuda"))
    monkeypatch.setenv("BULKGEN_FP8_HW_ROUNDING", "1")  # A/B runs: the environment decides
    assert fp8_kernels.hw_rounding(torch.device("cuda"))
    monkeypatch.setattr(fp8_kernels, "HW_ROUNDING", True)
    monkeypatch.setenv("BULKGEN_FP8_HW_ROUNDING", "0")
    assert not fp8_kernels.hw_rounding(torch.device("cuda"))
    monkeypatch.setenv("BULKGEN_FP8_HW_ROUNDING", "yes")
    with pytest.raises(ValueError, match="1 or 0"):
        fp8_kernels.hw_rounding(torch.device("cuda"))


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("one_pass", [False, True])
def test_gpu_the_casts_own_rounding_gives_torchs_bits(monkeypatch, one_pass):
    # fp8_kernels.HW_ROUNDING: the kernels skip _round_e4m3 and let the cast round.
    from bulkgen.model import fp8_fused, fp8_kernels
    from bulkgen.model.fused import rms_norm, silu_and_mul

    monkeypatch.setattr(fp8_kernels, "HW_ROUNDING", True)
    monkeypatch.delenv("BULKGEN_FP8_HW_ROUNDING", raising=False)
    one = torch.tensor(1.0, device=DEVICE)
    x = every_e4m3_value_and_midpoint()
    q, _ = quantize_rows(x.to(DEVICE), one, one_pass)
    ref_q, _ = quantize_rows_reference(x, one.cpu())
    assert torch.equal(q.cpu().view(torch.uint8), ref_q.view(torch.uint8))
    rows = (torch.randn(64, 5000) * 3).to(torch.bfloat16)
    rows[1] = 0
    rows[2, :5] = torch.tensor([1e-6, -1e-4, 0.5, -7.0, 9.0])
    q, scale = quantize_rows(rows.to(DEVICE), None, one_pass)
    ref_q, ref_scale = quantize_rows_reference(rows, None)
    assert torch.equal(scale.cpu(), ref_scale)
    assert torch.equal(q.cpu().view(torch.uint8), ref_q.view(torch.uint8))
    gate_up = (torch.randn(300, 2 * 5000, device=DEVICE) * 4).to(torch.bfloat16)
    ref = quantize_rows_reference(silu_and_mul(gate_up).cpu(), None)
    for form in fp8_fused.SILU_FORMS:
        out = fp8_fused.silu_and_mul_fp8(gate_up, form=form)
        assert torch.equal(out.q.cpu().view(torch.uint8), ref[0].view(torch.uint8)), form
        assert torch.equal(out.scale.cpu(), ref[1]), form
    weight = (torch.rand(5000, device=DEVICE) + 0.5).to(torch.bfloat16)
    x = rows.to(DEVICE)
    out = fp8_fused.rms_norm_fp8(x, weight, 1e-6)
    ref = quantize_rows_reference(rms_norm(x, weight, 1e-6).cpu(), None)
    assert torch.equal(out.q.cpu().view(torch.uint8), ref[0].view(torch.uint8))
