"""The fused Triton ops equal the torch code they replace in llama.py.

Without CUDA the kernels run in float32 under the Triton interpreter (TRITON_INTERPRET must be set
before triton is imported, hence the order below). The interpreter mishandles bfloat16, so the
half-precision dtypes, the Llama-3-8B shapes and CUDA-graph replay are in the GPU-marked tests.
Every output buffer the ops allocate starts as NaN, so an element a kernel skips fails to compare.

Half-precision tolerance, in units in the last place (ulps) of the output dtype: the residual add
must equal torch's bit for bit; rotary rounds at exactly the points torch does, so it should too,
and is allowed 1 ulp. The norm sums squares in another order and SiLU's expf may be contracted
differently, so a normalised value or an activation can differ by 1 ulp; the product with the
weight or with up can turn that into 2 ulps of the output (seen in simulation), hence 2 there.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bulkgen.model.fused import add_rms_norm, rms_norm, silu_and_mul  # noqa: E402
from bulkgen.model.fused_rotary import rotary  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP32_TOLERANCE = 1e-5
EPS = 1e-6
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
HALF_DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def nan_buffers(monkeypatch):
    """Floating-point torch.empty returns NaN-filled tensors: unwritten outputs fail to compare."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", poisoned)


# ---- the torch code of llama.py, as the oracle ------------------------------------------------


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def ref_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def ref_rotary(q, k, positions, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    c = cos[positions].unsqueeze(1).to(q.dtype)
    s = sin[positions].unsqueeze(1).to(q.dtype)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    return rotate(q), rotate(k)


# ---- inputs and comparisons -------------------------------------------------------------------


def rope_tables(max_pos: int, head_dim: int, theta: float = 500000.0):
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq).to(DEVICE)
    return freqs.cos(), freqs.sin()


def qkv_views(T: int, q_heads: int, k_heads: int, head_dim: int, dtype: torch.dtype):
    """A fused qkv projection output and q, k [T, heads, D] as strided views into it (llama.py)."""
    q_size, kv_size = q_heads * head_dim, k_heads * head_dim
    qkv = torch.randn(T, q_size + 2 * kv_size, device=DEVICE).to(dtype)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return qkv, q.view(T, q_heads, head_dim), k.view(T, k_heads, head_dim)


def norm_weight(H: int, dtype: torch.dtype) -> torch.Tensor:
    return (1 + 0.5 * torch.randn(H, device=DEVICE)).to(dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


def ulp_distance(out: torch.Tensor, ref: torch.Tensor) -> int:
    """Largest distance, in representable values of a 16-bit float dtype, between out and ref."""
    assert out.dtype == ref.dtype and out.dtype in HALF_DTYPES
    assert torch.isfinite(out).all()

    def ordered(x: torch.Tensor) -> torch.Tensor:  # sign-magnitude bits -> monotone integers
        bits = x.contiguous().view(torch.int16).int()
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(out) - ordered(ref)).abs().max().item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, max_ulps: int) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    if out.dtype == torch.float32:
        assert rel_err(out, ref) < FP32_TOLERANCE
    else:
        assert ulp_distance(out, ref) <= max_ulps
        assert rel_err(out, ref) < 1e-2


# ---- CPU (interpreter) and GPU: float32 ------------------------------------------------------


@pytest.mark.parametrize("H", [16, 64, 576, 1536, 4096])
def test_rms_norm_matches_reference_for_any_width(H):
    x = 3 * torch.randn(7, H, device=DEVICE)
    weight = norm_weight(H, torch.float32)
    assert_close(rms_norm(x, weight, EPS), ref_rms_norm(x, weight, EPS), 2)


def test_rms_norm_reads_rows_with_a_stride():
    x = torch.randn(5, 192, device=DEVICE)[:, 64:]
    weight = norm_weight(128, torch.float32)
    assert_close(rms_norm(x, weight, EPS), ref_rms_norm(x, weight, EPS), 2)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rms_norm_of_heads_in_a_qkv_view_is_the_per_head_norm(head_dim):
    _, q, k = qkv_views(9, 6, 2, head_dim, torch.float32)  # Qwen3's q_norm and k_norm
    weight = norm_weight(head_dim, torch.float32)
    for x in (q, k):
        assert_close(rms_norm(x, weight, EPS), ref_rms_norm(x, weight, EPS), 2)


@pytest.mark.parametrize("H", [64, 576, 4096])
def test_add_rms_norm_returns_the_sum_and_its_norm(H):
    x, residual = torch.randn(2, 6, H, device=DEVICE)
    weight = norm_weight(H, torch.float32)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(new_residual, x + residual)
    assert_close(out, ref_rms_norm(x + residual, weight, EPS), 2)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


def test_add_rms_norm_writes_the_sum_into_a_given_buffer():
    """residual_out (mixed_graphs.py's static buffer): a new tensor's bits, for the Triton op and
    the torch one; the residual itself (read by other programs) or another shape is refused."""
    from bulkgen.model import ops

    x, residual, weight = *torch.randn(2, 6, 576, device=DEVICE), norm_weight(576, torch.float32)
    for op in (add_rms_norm, ops.add_rms_norm):
        out, new_residual = op(x, residual, weight, EPS)
        into = torch.full_like(x, float("nan"))
        given_out, given = op(x, residual, weight, EPS, residual_out=into)
        assert given is into and torch.equal(into, new_residual) and torch.equal(given_out, out)
    with pytest.raises(ValueError, match="apart from residual"):
        add_rms_norm(x, residual, weight, EPS, residual_out=residual)
    with pytest.raises(ValueError, match="residual_out must be"):
        add_rms_norm(x, residual, weight, EPS, residual_out=torch.empty(6, 575, device=DEVICE))


def test_norms_of_no_rows_are_empty():
    x, weight = torch.randn(0, 64, device=DEVICE), norm_weight(64, torch.float32)
    assert rms_norm(x, weight, EPS).shape == (0, 64)
    assert [t.shape for t in add_rms_norm(x, x, weight, EPS)] == [(0, 64)] * 2


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # numpy, in the interpreter
@pytest.mark.parametrize("I", [64, 576, 1536, 2500])
def test_silu_and_mul_matches_reference(I):
    gate_up = 4 * torch.randn(5, 2 * I, device=DEVICE)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp(-gate) overflows at -100
    assert_close(silu_and_mul(gate_up), ref_silu_and_mul(gate_up), 2)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("q_heads, k_heads", [(4, 1), (6, 2), (8, 8), (5, 5)])
def test_rotary_of_qkv_views_matches_reference(head_dim, q_heads, k_heads):
    T, max_pos = 11, 4096
    _, q, k = qkv_views(T, q_heads, k_heads, head_dim, torch.float32)
    cos, sin = rope_tables(max_pos, head_dim)
    positions = torch.randperm(max_pos, device=DEVICE)[:T]  # out of order, far apart
    q_before, k_before = q.clone(), k.clone()
    q_out, k_out = rotary(q, k, positions, cos, sin)
    q_ref, k_ref = ref_rotary(q, k, positions, cos, sin)
    assert_close(q_out, q_ref, 1)
    assert_close(k_out, k_ref, 1)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)  # the result is a new tensor


# ---- GPU only: half precision at the Llama-3-8B shapes, CUDA graphs -----------------------------

TOKENS = [1, 32, 256, 2048]


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("T", TOKENS)
def test_gpu_rms_norm_and_add_rms_norm_at_llama_shape(dtype, T):
    x, residual = torch.randn(2, T, 4096, device=DEVICE).to(dtype)
    weight = norm_weight(4096, dtype)
    assert_close(rms_norm(x, weight, 1e-5), ref_rms_norm(x, weight, 1e-5), 2)
    out, new_residual = add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(new_residual, x + residual)
    assert_close(out, ref_rms_norm(x + residual, weight, 1e-5), 2)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("H", [128, 576, 1536, 8192])
def test_gpu_rms_norm_other_widths(dtype, H):
    x, weight = torch.randn(300, H, device=DEVICE).to(dtype), norm_weight(H, dtype)
    assert_close(rms_norm(x, weight, 1e-6), ref_rms_norm(x, weight, 1e-6), 2)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_gpu_per_head_norm_of_qkv_views(dtype):
    _, q, k = qkv_views(256, 32, 8, 128, dtype)
    weight = norm_weight(128, dtype)
    for x in (q, k):
        assert_close(rms_norm(x, weight, 1e-6), ref_rms_norm(x, weight, 1e-6), 2)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("T", TOKENS)
def test_gpu_silu_and_mul_at_llama_shape(dtype, T):
    gate_up = (4 * torch.randn(T, 2 * 14336, device=DEVICE)).to(dtype)
    assert_close(silu_and_mul(gate_up), ref_silu_and_mul(gate_up), 2)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("T", TOKENS)
def test_gpu_rotary_at_llama_shape(dtype, T):
    _, q, k = qkv_views(T, 32, 8, 128, dtype)
    cos, sin = rope_tables(8192, 128)
    positions = torch.randint(0, 8192, (T,), device=DEVICE)
    q_out, k_out = rotary(q, k, positions, cos, sin)
    q_ref, k_ref = ref_rotary(q, k, positions, cos, sin)
    assert_close(q_out, q_ref, 1)
    assert_close(k_out, k_ref, 1)


@gpu
@needs_cuda
def test_gpu_add_rms_norm_and_rotary_replay_in_a_cuda_graph_with_new_data():
    T, H, dtype = 32, 4096, torch.bfloat16
    x, residual = torch.randn(2, T, H, device=DEVICE).to(dtype)
    weight = norm_weight(H, dtype)
    qkv, q, k = qkv_views(T, 32, 8, 128, dtype)
    cos, sin = rope_tables(8192, 128)
    positions = torch.randint(0, 8192, (T,), device=DEVICE)

    def step():
        return (*add_rms_norm(x, residual, weight, 1e-5), *rotary(q, k, positions, cos, sin))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and load the kernels before capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, new_residual, q_out, k_out = step()

    for _ in range(3):
        for static in (x, residual, qkv):
            static.copy_(torch.randn(static.shape, device=DEVICE).to(dtype))
        positions.copy_(torch.randint(0, 8192, (T,), device=DEVICE))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(new_residual, x + residual)
        assert_close(out, ref_rms_norm(x + residual, weight, 1e-5), 2)
        q_ref, k_ref = ref_rotary(q, k, positions, cos, sin)
        assert_close(q_out, q_ref, 1)
        assert_close(k_out, k_ref, 1)
