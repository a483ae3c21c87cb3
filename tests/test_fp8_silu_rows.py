"""silu_and_mul_fp8's rows forms (fp8_silu_rows.py): "rows" gives the other forms' bits, and
"rows_fast" (approximate silu and scaling) puts at most rare values one e4m3 step from them.

Without CUDA the kernels run under the Triton interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order), where rows_fast's arithmetic is exact.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from bulkgen.model import fused  # noqa: E402
from bulkgen.model.fp8_fused import (  # noqa: E402
    FAST_SILU_FORMS,
    SILU_FORMS,
    default_silu_form,
    silu_and_mul_fp8,
)
from bulkgen.model.fp8_kernels import quantize_rows  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many e4m3 values lie between each pair of a and b (same-sign codes are ordered by
    magnitude; a sign change counts the codes to zero on both sides)."""
    a, b = a.view(torch.uint8).long(), b.view(torch.uint8).long()
    same_sign = (a & 0x80) == (b & 0x80)
    return torch.where(same_sign, (a - b).abs(), (a & 0x7F) + (b & 0x7F))


def test_rows_is_a_bit_exact_form_and_rows_fast_is_not_claimed_to_be():
    assert "rows" in SILU_FORMS and "rows_fast" in FAST_SILU_FORMS
    assert "rows_fast" not in SILU_FORMS


@pytest.mark.parametrize("rows, width", [(1, 128), (3, 1536), (4, 5000)])
def test_rows_forms_equal_the_op_then_the_quantizer(rows, width):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * width, device=DEVICE) * 4
    gate_up[0, :3] = torch.tensor([0.0, -30.0, 30.0])  # silu's saturated ends
    q, scale = quantize_rows(fused.silu_and_mul(gate_up))
    exact = silu_and_mul_fp8(gate_up, form="rows")
    assert torch.equal(exact.scale, scale)
    assert torch.equal(exact.q.view(torch.uint8), q.view(torch.uint8))
    fast = silu_and_mul_fp8(gate_up, form="rows_fast")
    assert torch.allclose(fast.scale, scale, rtol=1e-5, atol=0)
    apart = steps_apart(fast.q, q)
    assert apart.max() <= 1 and apart.float().mean() < 1e-3


def test_the_fast_form_can_be_forced_for_an_ab_run(monkeypatch):
    monkeypatch.setenv("BULKGEN_SILU_FORM", "rows_fast")
    assert default_silu_form(889, 14336) == "rows_fast"
    gate_up = torch.randn(2, 256, device=DEVICE)
    out = silu_and_mul_fp8(gate_up)
    assert out.q.shape == (2, 128) and out.scale.shape == (2, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 37, 889, 8192])
def test_rows_forms_on_cuda_at_the_8b_width(rows):
    gate_up = torch.randn(rows, 2 * 14336, device="cuda", dtype=torch.bfloat16) * 4
    stash = silu_and_mul_fp8(gate_up, form="stash")
    exact = silu_and_mul_fp8(gate_up, form="rows")
    assert torch.equal(exact.scale, stash.scale)
    assert torch.equal(exact.q.view(torch.uint8), stash.q.view(torch.uint8))
    fast = silu_and_mul_fp8(gate_up, form="rows_fast")
    assert torch.allclose(fast.scale, stash.scale, rtol=1e-2, atol=0)  # a bf16 ulp of the absmax
    apart = steps_apart(fast.q, stash.q)
    assert apart.max() <= 1 and apart.float().mean() < 1e-4
