"""The Triton attention kernels over an fp8 KV cache agree with the torch reference backend.

Under the Triton interpreter (no CUDA) the kernels run on tiny shapes. The interpreter reads fp8
exactly, but its float32 -> fp8 cast rounds ties up and drops the carry into the exponent
(124.5 becomes 64, not 128), so on the CPU the write kernel is checked on values that need no
rounding (the e4m3 grid times a power-of-two scale, and values past the range, which saturate);
the rounding itself is checked on the GPU, where it must match torch bit for bit. The
attention kernels read caches quantized by the torch reference, with scales that are not 1, so
a scale applied twice, never, or to the wrong one of K and V shows.
"""

from __future__ import annotations

import os
import re

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_triton_kernels import DEVICE, metadata, nan_buffers, paged_kv, rel_err  # noqa: E402, F401

from bulkgen.model.attention import (  # noqa: E402
    decode_tiling,
    torch_backend,
    triton_backend,
    triton_decode,
    triton_prefill,
)
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE, FP8_MAX, quantize  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402

CACHES = ("bf16", "fp8")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
K_SCALE, V_SCALE = 0.25, 3.0  # distinct and not 1: a scale lost or swapped changes the output
gpu = pytest.mark.gpu
# Every buffer the kernels allocate starts as NaN (test_triton_kernels.nan_buffers).
pytestmark = pytest.mark.usefixtures("nan_buffers")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def fp8_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, num_blocks=None, width=None):
    """paged_kv's layout, quantized by the reference with K_SCALE/V_SCALE (NaN slots stay NaN,
    which the interpreter reads back as 480: large enough to show if a kernel reads one)."""
    shape = (seq_lens, block_size, num_kv_heads, head_dim, torch.float32, num_blocks, width)
    k, v, block_tables = paged_kv(*shape)
    # Scaled so that the quantized values use e4m3's range, not only its top.
    return quantize(k * K_SCALE * 4, K_SCALE), quantize(v * V_SCALE, V_SCALE), block_tables


def check_fp8_prefill(seq_lens, query_lens, num_kv_heads, group, head_dim, block_size, dtype):
    k_cache, v_cache, block_tables = fp8_paged_kv(seq_lens, block_size, num_kv_heads, head_dim)
    meta = metadata(seq_lens, query_lens, block_tables)
    q = torch.randn(sum(query_lens), num_kv_heads * group, head_dim, device=DEVICE).to(dtype)
    args = (q, k_cache, v_cache, meta, head_dim**-0.5, K_SCALE, V_SCALE)
    out = triton_backend.paged_attention(*args)
    ref = torch_backend.paged_attention(*args)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < TOLERANCE[dtype]
    return out


def check_f16_products(monkeypatch, dtype):
    """triton_prefill's DOT_F16 (prefill_tiling.F16_PRODUCTS, the default): the query scaled,
    then rounded to fp16; K, V and the weights in fp16."""
    monkeypatch.delenv("BULKGEN_PREFILL_F16", raising=False)  # the A/B switch: the default
    seq_lens, query_lens = [23, 1, 40, 150], [23, 1, 13, 70]
    monkeypatch.setattr(triton_prefill, "F16_PRODUCTS", False)
    torch.manual_seed(1)
    plain = check_fp8_prefill(seq_lens, query_lens, 2, 4, 32, 8, dtype)
    monkeypatch.setattr(triton_prefill, "F16_PRODUCTS", True)
    torch.manual_seed(1)
    f16 = check_fp8_prefill(seq_lens, query_lens, 2, 4, 32, 8, dtype)
    assert not torch.equal(plain, f16)  # the products did change operands


def test_prefill_products_on_fp16_operands_match_the_reference(monkeypatch):
    check_f16_products(monkeypatch, torch.float16)


@gpu
@needs_cuda
def test_gpu_prefill_products_on_fp16_operands_match_the_reference_for_a_bf16_query(monkeypatch):
    check_f16_products(monkeypatch, torch.bfloat16)


def check_fp8_decode(seq_lens, num_kv_heads, group, head_dim, block_size, dtype, num_splits=None):
    k_cache, v_cache, block_tables = fp8_paged_kv(seq_lens, block_size, num_kv_heads, head_dim)
    meta = metadata(seq_lens, [1] * len(seq_lens), block_tables, decode_only=True)
    q = torch.randn(len(seq_lens), num_kv_heads * group, head_dim, device=DEVICE).to(dtype)
    scale = head_dim**-0.5
    out = paged_decode(
        q, k_cache, v_cache, meta.seq_lens, block_tables, scale, num_splits,
        k_scale=K_SCALE, v_scale=V_SCALE,
    )  # fmt: skip
    ref = torch_backend.paged_attention(q, k_cache, v_cache, meta, scale, K_SCALE, V_SCALE)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < TOLERANCE[dtype]


def e4m3_grid_values(n: int) -> torch.Tensor:
    """n random finite e4m3 values, subnormals and both extremes included."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    finite = codes[codes.isfinite()]
    return finite[torch.randint(len(finite), (n,))]


# ---- CPU (interpreter) and GPU: tiny shapes -------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_kv_quantizes_with_the_layer_scale_and_saturates(dtype):
    num_blocks, block_size, num_kv_heads, head_dim = 6, 4, 3, 16
    k_scale, v_scale = 0.5, 4.0  # powers of two: x / scale is exact, no rounding needed
    # fp16 holds e4m3 values exactly only up to 65504 / 4: 448 * 4 fits.
    k = (e4m3_grid_values(7 * num_kv_heads * head_dim) * k_scale).view(7, num_kv_heads, head_dim)
    v = (e4m3_grid_values(7 * num_kv_heads * head_dim) * v_scale).view(7, num_kv_heads, head_dim)
    k[0, 0, :4] = torch.tensor([1000.0, -1000.0, 224.5, -300.0])  # past 448 * k_scale = 224
    k, v = k.to(dtype).to(DEVICE), v.to(dtype).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:7]
    slots[[2, 5]] = -1  # padding rows of a CUDA-graph batch
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=DEVICE).to(FP8_DTYPE)
    v_cache = torch.randn(shape, device=DEVICE).to(FP8_DTYPE)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    triton_backend.write_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    torch_backend.write_kv(k, v, k_ref, v_ref, slots, k_scale, v_scale)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    stored = k_cache.view(-1, num_kv_heads, head_dim)[slots[0]].float()
    assert stored[0, :4].tolist() == [FP8_MAX, -FP8_MAX, FP8_MAX, -FP8_MAX]
    written = slots >= 0
    got_v = v_cache.view(-1, num_kv_heads, head_dim)[slots[written]].float() * v_scale
    assert torch.equal(got_v, v[written].float())  # dequantized: the values written


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group, head_dim, block_size", [(1, 16, 4), (4, 32, 8), (3, 16, 4)])
def test_prefill_over_fp8_cache_matches_reference(dtype, group, head_dim, block_size):
    # A full prompt, a decode row, a chunk after cached (prefix) context, a chunk longer than a
    # query tile.
    seq_lens, query_lens = [23, 1, 40, 9, 150], [23, 1, 13, 1, 70]
    check_fp8_prefill(seq_lens, query_lens, 2, group, head_dim, block_size, dtype)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_over_fp8_cache_matches_reference(num_splits, dtype):
    check_fp8_decode([1, 2, 63, 64, 65, 300, 9], 2, 4, 32, 4, dtype, num_splits)


def test_reference_attention_over_fp8_equals_attention_over_its_dequantized_values():
    seq_lens, query_lens = [30, 12, 5], [30, 1, 2]
    k8, v8, block_tables = fp8_paged_kv(seq_lens, 4, 2, 16)
    k32, v32 = k8.float() * K_SCALE, v8.float() * V_SCALE
    q = torch.randn(sum(query_lens), 4, 16, device=DEVICE)
    meta = metadata(seq_lens, query_lens, block_tables)
    out = torch_backend.paged_attention(q, k8, v8, meta, 0.25, K_SCALE, V_SCALE)
    assert torch.equal(out, torch_backend.paged_attention(q, k32, v32, meta, 0.25))


def test_scales_are_ignored_by_a_full_precision_cache():
    seq_lens = [20, 7]
    k_cache, v_cache, block_tables = paged_kv(seq_lens, 4, 2, 16, torch.float32)
    meta = metadata(seq_lens, [1, 1], block_tables, decode_only=True)
    q = torch.randn(2, 4, 16, device=DEVICE)
    plain = triton_backend.paged_attention(q, k_cache, v_cache, meta, 0.25)
    scaled = triton_backend.paged_attention(q, k_cache, v_cache, meta, 0.25, K_SCALE, V_SCALE)
    assert torch.equal(plain, scaled)


def test_kernels_compile_for_sm90_with_the_fp8_casts_only_in_the_fp8_variants(
    attention_compile_check,
):
    """The GPU compiler accepts every variant of each kernel (the interpreter never runs it), and
    the bf16 and int8 variants carry no fp8 code: the constexpr branch compiles away. The decode
    kernel with v_in_registers, and decode and prefill over values stored slots inner
    (kv_layout.py), read no 8-bit tile back from shared memory one byte at a time; over the rows
    layout decode does. int8 (kv_int8.py) has every kernel but fp8's experiments and pairs (its
    engine layout is slots inner, its measured launches prefetch block ids), and its variants
    load the scales that the others do not (more instructions than bf16)."""
    lines = re.findall(
        r"^([\w-]+ +\w+) *:.* (\d+) instructions, .* (\d+) shared byte reads, "
        r"\d+ e4m3 products, (\d+) e4m3 conversions$",
        attention_compile_check,
        re.M,
    )
    name = {k: " ".join(k.split()) for k, *_ in lines}
    instructions = {name[k]: int(i) for k, i, _, _ in lines}
    byte_reads = {name[k]: int(b) for k, _, b, _ in lines}
    counts = {name[k]: int(n) for k, _, _, n in lines}
    kernels = ("write_kv", "decode", "decode-vreg", "prefill", "invariant")
    slots_inner = ("write_kv-vslots", "decode-vslots", "prefill-vslots")
    expected = {f"{k} {c}" for k in kernels for c in CACHES + ("int8",)}
    experiments = {"decode-prefetch fp8", "decode-prefetch int8", "prefill-pvfp8 fp8"}
    experiments |= {"decode-mma fp8"}  # decode_mma.py
    experiments |= {"decode-rotary fp8", "decode-rotary bf16"}  # decode_rotary.py
    experiments |= {f"{k}-pairs fp8" for k in ("write_kv", "decode", "prefill")}  # kv_pairs.py
    slots_inner_caches = (*CACHES, "int8")
    assert (
        set(counts)
        == expected | {f"{k} {c}" for k in slots_inner for c in slots_inner_caches} | experiments
    )
    for variant, n in counts.items():
        assert (n > 0) == variant.endswith("fp8"), counts
    assert byte_reads["decode fp8"] > 0 and byte_reads["decode int8"] > 0, byte_reads
    for variant in (
        "decode-vreg fp8",
        "decode-vslots fp8",
        "prefill-vslots fp8",
        "decode-prefetch fp8",
        "prefill-pvfp8 fp8",
        "decode-pairs fp8",
        "prefill-pairs fp8",
        "decode-mma fp8",
        "decode-rotary fp8",
    ):
        assert byte_reads[variant] == 0, byte_reads
    for variant in ("decode-vreg", "decode-vslots", "prefill-vslots", "decode-prefetch"):
        assert byte_reads[f"{variant} int8"] == 0, byte_reads
    assert all(n == 0 for v, n in byte_reads.items() if v.endswith("bf16")), byte_reads
    for kernel in kernels:
        assert instructions[f"{kernel} int8"] > instructions[f"{kernel} bf16"], instructions


# ---- GPU only: real shapes and the rounding ---------------------------------------------------


@gpu
@needs_cuda
@pytest.mark.parametrize("k_scale, v_scale", [(1.0, 1.0), (0.037, 0.11)])
def test_gpu_write_kv_rounds_like_torch(k_scale, v_scale):
    num_tokens, num_kv_heads, head_dim = 300, 8, 128
    k = (torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE) * 20).bfloat16()
    v = (torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE) * 3).bfloat16()
    shape = (64, 16, num_kv_heads, head_dim)
    k_cache = torch.zeros(shape, dtype=FP8_DTYPE, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(64 * 16, device=DEVICE)[:num_tokens]
    triton_backend.write_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    torch_backend.write_kv(k, v, k_ref, v_ref, slots, k_scale, v_scale)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))


@gpu
@needs_cuda
@pytest.mark.parametrize("group, head_dim, block_size", [(1, 64, 16), (4, 128, 16), (8, 128, 32)])
def test_gpu_fp8_prefill_matches_reference(group, head_dim, block_size):
    seq_lens = [1, 17, 300, 2048, 4097]
    query_lens = [1, 17, 100, 2048, 1000]
    check_fp8_prefill(seq_lens, query_lens, 2, group, head_dim, block_size, torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 5])
@pytest.mark.parametrize("v_in_registers", [False, True])
def test_gpu_fp8_decode_matches_reference(monkeypatch, num_splits, v_in_registers):
    launch = triton_decode.decode_launch(128, fp8=True)._replace(v_in_registers=v_in_registers)
    monkeypatch.setattr(triton_decode, "decode_launch", lambda *_: launch)
    seq_lens = [1, 2, 15, 16, 17, 1000, 8191]
    check_fp8_decode(seq_lens, 8, 4, 128, 16, torch.bfloat16, num_splits)


def test_an_fp8_cache_reads_tiles_of_as_many_bytes_as_bf16_unless_measured(monkeypatch):
    """Without a measured launch, fp8 tiles hold twice the tokens of bf16 ones (the same bytes
    a loop step); a measured one (decode_tilings.json) wins for its head dim only."""
    monkeypatch.setattr(decode_tiling, "measured_launches", lambda: {})
    bf16_tile = decode_tiling.decode_block_n(128)
    assert decode_tiling.decode_launch(128, fp8=True).block_n == 2 * bf16_tile
    assert decode_tiling.decode_launch(128, fp8=False).block_n == bf16_tile
    table = {"fp8": {"128": {"block_n": 256, "num_warps": 8, "num_stages": 4}}}
    monkeypatch.setattr(decode_tiling, "measured_launches", lambda: table)
    assert decode_tiling.decode_launch(128, fp8=True) == decode_tiling.DecodeLaunch(256, 8, 4)
    assert decode_tiling.decode_launch(64, fp8=True).block_n == 128
    assert decode_tiling.decode_launch(128, fp8=False).block_n == 64


@pytest.mark.parametrize("v_in_registers", [False, True])
@pytest.mark.parametrize("block_n, num_splits", [(32, 1), (128, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_over_fp8_cache_matches_reference_with_every_launch(
    monkeypatch, block_n, num_splits, v_in_registers, dtype
):
    launch = decode_tiling.DecodeLaunch(block_n, v_in_registers=v_in_registers)
    monkeypatch.setattr(triton_decode, "decode_launch", lambda *_: launch)
    check_fp8_decode([1, 2, 63, 64, 65, 300, 9], 2, 4, 32, 4, dtype, num_splits)
