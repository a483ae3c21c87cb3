"""silu_and_mul_fp8's rows_fast form (fp8_silu_rows.py; approximate silu and scaling), the default
where a row fits its registers, puts at most rare values one e4m3 step from the exact forms'.

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
from bulkgen.model.fp8_silu_rows import ROWS_MAX_WIDTH  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many e4m3 values lie between each pair of a and b (same-sign codes are ordered by
    magnitude; a sign change counts the codes to zero on both sides)."""
    a, b = a.view(torch.uint8).long(), b.view(torch.uint8).long()
    same_sign = (a & 0x80) == (b & 0x80)
    return torch.where(same_sign, (a - b).abs(), (a & 0x7F) + (b & 0x7F))


def test_rows_fast_is_the_default_where_a_row_fits_and_is_not_called_bit_exact(monkeypatch):
    monkeypatch.delenv("BULKGEN_SILU_FORM", raising=False)
    assert "rows_fast" in FAST_SILU_FORMS and "rows_fast" not in SILU_FORMS
    for rows in (1, 32, 889, 8192):
        assert default_silu_form(rows, 14336) == "rows_fast"
        assert default_silu_form(rows, ROWS_MAX_WIDTH) == "rows_fast"
        assert default_silu_form(rows, ROWS_MAX_WIDTH + 1) == "stash"  # e.g. 70B's 28,672


@pytest.mark.parametrize("rows, width", [(1, 128), (3, 1536), (4, 5000)])
def test_rows_fast_equals_the_op_then_the_quantizer_to_a_step(rows, width):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * width, device=DEVICE) * 4
    gate_up[0, :3] = torch.tensor([0.0, -30.0, 30.0])  # silu's saturated ends
    q, scale = quantize_rows(fused.silu_and_mul(gate_up))
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
def test_rows_fast_on_cuda_at_the_8b_width(rows):
    # Measured on the H200 (cd80261, bench_fp8_fused.py --forms): 0.02-0.06% of values one step
    # apart at 32-8,192 rows, 0.55% of a single row's; no scale apart.
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 14336, device="cuda", dtype=torch.bfloat16) * 4
    stash = silu_and_mul_fp8(gate_up, form="stash")
    fast = silu_and_mul_fp8(gate_up, form="rows_fast")
    assert torch.allclose(fast.scale, stash.scale, rtol=1e-2, atol=0)  # a bf16 ulp of the absmax
    apart = steps_apart(fast.q, stash.q)
    assert apart.max() <= 1 and apart.float().mean() < (2e-2 if rows == 1 else 2e-3)
