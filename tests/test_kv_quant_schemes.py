"""The quantize-dequantize emulations that scripts/accuracy_kv_schemes.py measures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from kv_quant_schemes import (  # noqa: E402
    E4M3,
    E5M2,
    first_kept,
    fp8_fixed,
    fp8_per_token,
    hadamard,
    int8_per_token,
    own_mean_centred,
    rotated,
)

from bulkgen.model.attention.kv_fp8 import dequantize, quantize  # noqa: E402


def test_fixed_scale_matches_the_cache_arithmetic():
    x = torch.randn(64, 3, 64) * 5
    for scale in (1.0, 0.05, 2.0):
        assert torch.equal(fp8_fixed(x, scale), dequantize(quantize(x, scale), scale))


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_per_token_round_trips_representable_values(dtype):
    # Each head vector's amax maps to the format's largest finite value: a vector of fp8 values
    # whose amax is that value, times a power of two, has an exact scale and comes back exactly.
    codes = torch.randn(16, 3, 64).to(dtype).float()
    codes[..., 0] = torch.finfo(dtype).max  # the amax of every vector
    x = codes * 2.0 ** torch.randint(-12, 6, (16, 3, 1)).float()
    assert torch.equal(fp8_per_token(x, dtype), x)


def test_per_token_bounds_the_relative_error_of_normal_values():
    x = torch.randn(256, 3, 64) * torch.logspace(-4, 3, 256)[:, None, None]
    got = fp8_per_token(x)
    amax = x.abs().amax(-1, keepdim=True)
    normal = x.abs() >= amax * 2.0**-6 / 448 * 2  # above e4m3's subnormals after scaling
    rel = ((got - x).abs() / x.abs())[normal]
    assert float(rel.max()) <= 2.0**-4 * 1.0001  # half an ulp of a 3-bit mantissa
    # The largest value of each vector is stored exactly (it maps to 448).
    assert torch.allclose(got.abs().amax(-1, keepdim=True), amax, rtol=1e-6)


def test_per_token_stores_a_zero_vector_as_zeros():
    x = torch.zeros(2, 3, 64)
    assert torch.equal(fp8_per_token(x), x)
    assert torch.equal(int8_per_token(x), x)


def test_int8_per_token_error_is_at_most_half_a_step():
    x = torch.randn(32, 3, 64)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert bool(((int8_per_token(x) - x).abs() <= step / 2 * 1.0001).all())


def test_hadamard_is_orthogonal_and_symmetric():
    h = hadamard(64)
    assert torch.allclose(h @ h, torch.eye(64), atol=1e-6)
    assert torch.equal(h, h.T)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(48)


def test_rotation_keeps_dot_products_and_an_exact_quantizer_is_identity():
    q, k = torch.randn(5, 3, 64), torch.randn(7, 3, 64)
    h = hadamard(64)
    assert torch.allclose(torch.einsum("qhd,khd->hqk", q @ h, k @ h),
                          torch.einsum("qhd,khd->hqk", q, k), atol=1e-4)  # fmt: skip
    assert torch.allclose(rotated(lambda x: x)(k), k, atol=1e-5)


def test_first_kept_rounds_the_first_rows_to_bfloat16_and_quantizes_the_rest():
    x = torch.randn(40, 3, 64) * 4
    got = first_kept(16, fp8_per_token)(x)
    assert torch.equal(got[:16], x[:16].to(torch.bfloat16).float())
    assert torch.equal(got[16:], fp8_per_token(x[16:]))
    assert not torch.equal(got[16:], x[16:].to(torch.bfloat16).float())


def test_own_mean_centred_quantizes_the_difference_from_the_sequences_mean():
    x = torch.randn(100, 2, 64) + 5.0  # a common offset, as keys have
    mu = x[16:80].mean(0, keepdim=True)
    got = own_mean_centred(fp8_per_token)(x)
    assert torch.allclose(got, fp8_per_token(x - mu) + mu)
    assert (got - x).abs().mean() < (fp8_per_token(x) - x).abs().mean() / 2
    short = x[:10]  # no rows to average: nothing is shifted
    assert torch.equal(own_mean_centred(fp8_per_token)(short), fp8_per_token(short))
