"""The norms and SiLU that write FP8 rows (fp8_fused.py) equal the bf16 op followed by the
activation quantizer, and a model whose layers use them computes what it computed without.

Without CUDA the kernels run under the Triton interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from bulkgen.model import fused  # noqa: E402
from bulkgen.model.fp8 import Fp8Activation, Fp8Linear, fuse_input_quantization  # noqa: E402
from bulkgen.model.fp8_fused import (  # noqa: E402
    SILU_FORMS,
    add_rms_norm_fp8,
    rms_norm_fp8,
    silu_and_mul_fp8,
)
from bulkgen.model.fp8_kernels import quantize_rows  # noqa: E402
from bulkgen.model.fp8_silu_split import SPLIT_BLOCK  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# The interpreter mishandles bfloat16 in the fused ops (see test_fused_ops.py): float32 here.
DTYPES = [torch.float32, torch.bfloat16] if DEVICE.type == "cuda" else [torch.float32]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def same(out: Fp8Activation, ref: tuple[torch.Tensor, torch.Tensor]) -> bool:
    q, scale = ref
    return torch.equal(out.scale, scale) and torch.equal(
        out.q.view(torch.uint8), q.view(torch.uint8)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(1, 64), (7, 576), (5, 4096)])
def test_fp8_norms_equal_the_norm_then_the_quantizer(dtype, rows, width):
    x = torch.randn(rows, width, device=DEVICE).to(dtype)
    residual = torch.randn(rows, width, device=DEVICE).to(dtype)
    weight = (torch.rand(width, device=DEVICE) + 0.5).to(dtype)
    assert same(rms_norm_fp8(x, weight, 1e-6), quantize_rows(fused.rms_norm(x, weight, 1e-6)))
    out, new_res = add_rms_norm_fp8(x, residual, weight, 1e-6)
    ref, ref_res = fused.add_rms_norm(x, residual, weight, 1e-6)
    assert same(out, quantize_rows(ref)) and torch.equal(new_res, ref_res)
    into = torch.full_like(x, float("nan"))  # mixed_graphs.py's static buffer
    out, new_res = add_rms_norm_fp8(x, residual, weight, 1e-6, residual_out=into)
    assert new_res is into and torch.equal(into, ref_res) and same(out, quantize_rows(ref))


@pytest.mark.parametrize("form", SILU_FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(1, 128), (3, 1536), (4, 5000)])  # one run, masked
def test_fp8_silu_and_mul_equals_silu_and_mul_then_the_quantizer(dtype, rows, width, form):
    gate_up = (torch.randn(rows, 2 * width, device=DEVICE) * 4).to(dtype)
    out = silu_and_mul_fp8(gate_up, form=form)
    assert same(out, quantize_rows(fused.silu_and_mul(gate_up)))


def test_the_split_silu_takes_each_rows_scale_from_all_its_chunks():
    # One large value per row, each in a different 2,048-wide chunk (and a zero row): a chunk's
    # own absmax would give the other chunks another scale.
    width = 3 * SPLIT_BLOCK + 100
    gate_up = torch.randn(4, 2 * width, device=DEVICE) * 0.1
    for row, col in enumerate((5, SPLIT_BLOCK + 7, 3 * SPLIT_BLOCK + 50)):
        gate_up[row, col], gate_up[row, width + col] = 6.0, 40.0
    gate_up[3] = 0.0
    split = silu_and_mul_fp8(gate_up, form="split")
    assert same(split, silu_and_mul_fp8(gate_up, form="two_pass"))
    assert same(split, quantize_rows(fused.silu_and_mul(gate_up)))
    assert same(silu_and_mul_fp8(gate_up, form="stash"), (split.q, split.scale))
    with pytest.raises(ValueError, match="form"):
        silu_and_mul_fp8(gate_up, form="three_pass")


def test_a_model_with_fused_input_quantization_computes_what_it_did_without(tiny_model_dir):
    from fp8_checkpoints import load, logits, relative_error

    model = load(tiny_model_dir, quantization="fp8")
    ids = list(range(5, 30))
    unfused = logits(model, ids)
    fuse_input_quantization(model)
    layer = model.model.layers[0]
    assert (
        layer.ops.add_rms_norm is add_rms_norm_fp8
        and layer.mlp.ops.silu_and_mul is silu_and_mul_fp8
    )
    assert layer.self_attn.ops.rms_norm is not rms_norm_fp8  # q/k norms and rotary keep theirs
    assert isinstance(layer.mlp.down_proj, Fp8Linear)
    # Measured 0.0. torch's and Triton's norms may round float32 apart in the last bit and flip
    # a rare FP8 rounding: far below FP8's own error (0.06 and more on this model).
    assert relative_error(logits(model, ids), unfused) < 1e-3


def test_the_fp8_kernels_compile_for_hopper():
    """The interpreter skips the GPU compiler, which rejects what it accepts (a module-level
    constant that is not a tl.constexpr, say): compile them for sm_90, in a process without
    TRITON_INTERPRET (no GPU needed)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    script = root / "scripts" / "fp8_compile_check.py"
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # Every kernel but the split SiLU's first launch (absmax, and the stash form's values in
    # bf16) writes e4m3.
    assert done.stdout.count("cvt to e4m3: yes") == 8
    assert "_silu_absmax_kernel" in done.stdout and done.stdout.count("cvt to e4m3: no") == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 37, 256])
def test_fp8_norms_and_silu_on_cuda_at_8b_widths_match_the_unfused_path(rows):
    def close(out: Fp8Activation, ref: tuple[torch.Tensor, torch.Tensor]) -> None:
        # Other kernels than the unfused pair, compiled apart: a float32 contraction may differ
        # in the last bit and flip a rare FP8 rounding, never more.
        assert torch.allclose(out.scale, ref[1], rtol=1e-6, atol=0)
        assert (out.q.float() != ref[0].float()).float().mean() < 1e-3

    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = (torch.rand(4096, device="cuda") + 0.5).to(torch.bfloat16)
    close(rms_norm_fp8(x, weight, 1e-5), quantize_rows(fused.rms_norm(x, weight, 1e-5)))
    out, new_res = add_rms_norm_fp8(x, residual, weight, 1e-5)
    ref, ref_res = fused.add_rms_norm(x, residual, weight, 1e-5)
    close(out, quantize_rows(ref))
    assert torch.equal(new_res, ref_res)
    gate_up = torch.randn(rows, 2 * 14336, device="cuda", dtype=torch.bfloat16) * 4
    # The default form there, rows_fast, approximates silu: test_fp8_silu_rows.py bounds it.
    close(silu_and_mul_fp8(gate_up, "stash"), quantize_rows(fused.silu_and_mul(gate_up)))
    one_pass = silu_and_mul_fp8(gate_up, form="one_pass")  # the same arithmetic: the same bits
    for form in ("two_pass", "split", "stash"):
        other = silu_and_mul_fp8(gate_up, form=form)
        assert torch.equal(one_pass.q.view(torch.uint8), other.q.view(torch.uint8)), form
        assert torch.equal(one_pass.scale, other.scale), form


def test_the_silu_form_follows_the_rows_and_the_override(monkeypatch):
    from bulkgen.model import fp8_fused

    monkeypatch.delenv("BULKGEN_SILU_FORM", raising=False)
    for rows in (1, 32, 128, 512, 2048, 8192, fp8_fused.SPLIT_MAX_ROWS):
        assert fp8_fused.default_silu_form(rows, 14336) == "rows_fast"  # test_fp8_silu_rows.py
    monkeypatch.setattr(fp8_fused, "ROWS_MAX_WIDTH", 1024)  # the exact forms past its width
    for rows in (1, 32, 128, 512, 2048, 8192, fp8_fused.SPLIT_MAX_ROWS):
        assert fp8_fused.default_silu_form(rows, 14336) == "stash"
    assert fp8_fused.default_silu_form(128, fp8_fused.ONE_PASS_MAX_WIDTH + 1) == "stash"
    assert fp8_fused.default_silu_form(fp8_fused.SPLIT_MAX_ROWS + 1, 14336) == "two_pass"
    monkeypatch.setattr(fp8_fused, "SPLIT_MAX_ROWS", 64)  # below the one-pass limit
    assert fp8_fused.default_silu_form(65, 14336) == "one_pass"
    assert fp8_fused.default_silu_form(fp8_fused.ONE_PASS_MAX_ROWS + 1, 14336) == "two_pass"
    assert fp8_fused.default_silu_form(128, fp8_fused.ONE_PASS_MAX_WIDTH + 1) == "two_pass"
    monkeypatch.setenv("BULKGEN_SILU_FORM", "one_pass")
    assert fp8_fused.default_silu_form(32, 14336) == "one_pass"
    monkeypatch.setenv("BULKGEN_SILU_FORM", "three_pass")
    with pytest.raises(ValueError, match="form"):
        silu_and_mul_fp8(torch.ones(2, 64, device=DEVICE))
