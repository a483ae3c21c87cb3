"""The Triton kernels over an int8 KV cache (kv_int8.py) agree with the torch reference backend.

Under the Triton interpreter (no CUDA) on tiny shapes; on the GPU (marked gpu) at the 8B shape.
The write kernel must store what kv_int8.quantize stores, bit for bit (values and scales). The
attention kernels read caches quantized by the reference, whose rows have scales spread over
three orders of magnitude, so a key or value scale lost, applied twice, to the wrong slot or to
the wrong one of K and V shows.
"""

from __future__ import annotations

import functools
import os
import re

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_triton_kernels import DEVICE, metadata, nan_buffers, paged_kv, rel_err  # noqa: E402, F401

from bulkgen import LLM, SamplingParams  # noqa: E402
from bulkgen.model.attention import (  # noqa: E402
    decode_tiling,
    torch_backend,
    triton_backend,
    triton_decode,
    triton_invariant,
)
from bulkgen.model.attention.kv_int8 import INT8_DTYPE, quantize  # noqa: E402
from bulkgen.model.attention.kv_layout import v_slots_inner  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402

TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
SMALL = 1e-3  # values of this magnitude (test_small_values_keep_fp16_precision...)
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = pytest.mark.usefixtures("nan_buffers")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def int8_paged_kv(seq_lens, block_size, num_kv_heads, head_dim, v_magnitude=None):
    """paged_kv's layout quantized by the reference: (k, v, k_scales, v_scales, block_tables).
    Rows are multiplied by 10**U(-2, 1), so their scales differ per token and head (values by
    v_magnitude instead, if given); unowned slots hold NaN scales (a kernel that reads one
    shows)."""
    k, v, block_tables = paged_kv(seq_lens, block_size, num_kv_heads, head_dim, torch.float32)
    out = []
    for x, magnitude in ((k, None), (v, v_magnitude)):
        if magnitude is None:
            magnitude = 10 ** (torch.rand(*x.shape[:3], 1, device=DEVICE) * 3 - 2)
        x = x * magnitude
        q, scale = quantize(torch.nan_to_num(x))
        out.append((q, torch.where(x.isnan().any(-1), float("nan"), scale)))
    (k8, k_scales), (v8, v_scales) = out
    return k8, v8, k_scales, v_scales, block_tables


def check_prefill(
    seq_lens,
    query_lens,
    num_kv_heads,
    group,
    head_dim,
    block_size,
    dtype,
    backend,
    v_magnitude=None,
):
    shape = (seq_lens, block_size, num_kv_heads, head_dim)
    k8, v8, k_s, v_s, block_tables = int8_paged_kv(*shape, v_magnitude)
    meta = metadata(seq_lens, query_lens, block_tables)
    q = torch.randn(sum(query_lens), num_kv_heads * group, head_dim, device=DEVICE).to(dtype)
    args = (q, k8, v8, meta, head_dim**-0.5, k_s, v_s)
    out = backend.paged_attention(*args)
    ref = torch_backend.paged_attention(*args)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < TOLERANCE[dtype]
    return rel_err(out, ref)


def check_decode(
    seq_lens, num_kv_heads, group, head_dim, block_size, dtype, num_splits=None, v_magnitude=None
):
    shape = (seq_lens, block_size, num_kv_heads, head_dim)
    k8, v8, k_s, v_s, block_tables = int8_paged_kv(*shape, v_magnitude)
    meta = metadata(seq_lens, [1] * len(seq_lens), block_tables, decode_only=True)
    q = torch.randn(len(seq_lens), num_kv_heads * group, head_dim, device=DEVICE).to(dtype)
    scale = head_dim**-0.5
    out = paged_decode(
        q, k8, v8, meta.seq_lens, block_tables, scale, num_splits, k_scale=k_s, v_scale=v_s
    )
    ref = torch_backend.paged_attention(q, k8, v8, meta, scale, k_s, v_s)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < TOLERANCE[dtype]
    return rel_err(out, ref)


def check_write(num_tokens, num_kv_heads, head_dim, block_size, dtype):
    num_blocks = -(-num_tokens // block_size) + 2
    k = torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE) * 10 ** torch.randn(
        num_tokens, num_kv_heads, 1, device=DEVICE
    )
    v = torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE)
    k[1, 0] = 0.0  # a zero row: scale 1, values 0
    k[2, 0, :4] = torch.tensor([2.5, -0.5, 127.0, 1.5])  # scale 1: exact ties round to even
    k[2, 0, 4:] = 0.0
    k, v = k.to(dtype), v.to(dtype)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slots[3] = -1  # a padding row of a CUDA-graph batch
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.randint(-127, 128, shape, dtype=INT8_DTYPE, device=DEVICE) for _ in "kv"]
    caches += [torch.rand(shape[:3], device=DEVICE) for _ in "kv"]
    ref = [c.clone() for c in caches]
    k_cache, v_cache, k_scales, v_scales = caches
    triton_backend.write_kv(k, v, k_cache, v_cache, slots, k_scales, v_scales)
    torch_backend.write_kv(k, v, ref[0], ref[1], slots, ref[2], ref[3])
    for got, want in zip(caches, ref, strict=True):
        assert torch.equal(got, want)
    row = k_cache.view(-1, num_kv_heads, head_dim)[slots[2], 0]
    assert row[:4].tolist() == [2, 0, 127, 2]
    assert k_scales.view(-1, num_kv_heads)[slots[1], 0] == 1.0
    assert not k_cache.view(-1, num_kv_heads, head_dim)[slots[1], 0].any()


# ---- CPU (interpreter) and GPU: tiny shapes -------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads", [1, 3])
def test_write_kv_stores_the_references_int8_values_and_scales_bit_for_bit(dtype, num_kv_heads):
    check_write(9, num_kv_heads, 16, 4, dtype)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_over_int8_cache_matches_reference(num_splits, dtype):
    check_decode([1, 2, 63, 64, 65, 300, 9], 2, 4, 32, 4, dtype, num_splits)


@pytest.mark.parametrize("block_n, block_size", [(32, 4), (128, 16), (32, 64)])
def test_decode_over_int8_cache_matches_reference_with_other_tiles(
    monkeypatch, block_n, block_size
):
    launch = decode_tiling.DecodeLaunch(block_n)
    monkeypatch.setattr(triton_decode, "decode_launch", lambda *_: launch)
    check_decode([1, 70, 300, 9], 2, 4, 32, block_size, torch.float16, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group, head_dim, block_size", [(1, 16, 4), (4, 32, 8), (3, 16, 4)])
def test_prefill_over_int8_cache_matches_reference(dtype, group, head_dim, block_size):
    # A full prompt, a decode row, a chunk after cached (prefix) context, a chunk longer than a
    # query tile.
    seq_lens, query_lens = [23, 1, 40, 9, 150], [23, 1, 13, 1, 70]
    check_prefill(seq_lens, query_lens, 2, group, head_dim, block_size, dtype, triton_backend)


def test_small_values_keep_fp16_precision_in_the_p_v_product():
    """Values of magnitude 1e-3 (scales ~3e-5): the softmax weights times the scales would fall
    into fp16's subnormals unless normalised per tile (4-9x the error of unit values, measured);
    with it the error stays that of values of magnitude 1."""
    seq_lens, query_lens = [23, 1, 40, 150], [23, 1, 13, 70]
    errors = {}
    for magnitude in (1.0, SMALL):
        torch.manual_seed(0)
        decode = check_decode([1, 70, 300, 9], 2, 4, 32, 4, torch.float16, 3, v_magnitude=magnitude)
        torch.manual_seed(0)
        prefill = check_prefill(
            seq_lens, query_lens, 2, 4, 32, 8, torch.float16, triton_backend, magnitude
        )
        errors[magnitude] = (decode, prefill)
    assert all(e < 2 * unit for e, unit in zip(errors[SMALL], errors[1.0], strict=True)), errors


def test_batch_invariant_attention_over_int8_cache_matches_reference():
    seq_lens, query_lens = [23, 1, 40, 9], [23, 1, 13, 1]
    check_prefill(seq_lens, query_lens, 2, 4, 32, 8, torch.float16, triton_invariant)


def check_invariant_row(length, pos, num_kv_heads, group, head_dim, block_size, dtype):
    k8, v8, k_s, v_s, block_tables = int8_paged_kv([length], block_size, num_kv_heads, head_dim)
    # The next positions (of its query tile, which a prefill reads) hold the largest values.
    later = torch.arange(pos + 1, pos + 4, device=DEVICE)
    largest = 10 * v_s.nan_to_num().max()
    v_s[block_tables[0, later // block_size].long(), later % block_size] = largest
    q = torch.randn(length, num_kv_heads * group, head_dim, device=DEVICE).to(dtype)
    args = (k8, v8, metadata([length], [length], block_tables), head_dim**-0.5, k_s, v_s)
    whole = triton_invariant.paged_attention(q, *args)
    meta = metadata([pos + 1], [1], block_tables, decode_only=True)
    alone = triton_invariant.paged_attention(q[pos : pos + 1], *(k8, v8, meta, *args[3:]))
    assert torch.equal(whole[pos], alone[0])


def test_the_invariant_kernel_gives_a_row_the_same_bits_in_a_prefill_and_decoded_alone():
    """A row's weights are normalised by the value scales of the keys it sees only: position
    100's output from a whole prefill (where the later positions of its K/V tile are cached and
    read) equals, bit for bit, its output decoded alone over the first 101 positions."""
    check_invariant_row(150, 100, 2, 4, 32, 16, torch.float16)


def test_the_write_kernel_divides_and_rounds_exactly_when_compiled_for_sm90(
    attention_compile_check,
):
    """What the interpreter cannot show: the GPU compiler keeps the int8 write kernel's arithmetic
    that of kv_int8.quantize. Only IEEE divisions (Triton's "/" compiles to an approximate one),
    and (y + 1.5 * 2**23) - 1.5 * 2**23 kept as two adds, which round to even (folded, nothing
    would round): a pair per element a thread stores, 2 x [8 heads, 128] over 128 threads."""
    line = re.search(r"^write_kv +int8 *:.*$", attention_compile_check, re.M)[0]
    pairs = int(re.search(r"(\d+) round-half-even pairs", line)[1])
    approximate = int(re.search(r"(\d+) approximate divisions", line)[1])
    assert (pairs, approximate) == (2 * 8 * 128 // 128, 0), line


# ---- GPU only: the 8B attention shape ---------------------------------------------------------


@gpu
@needs_cuda
def test_gpu_write_kv_matches_torch_at_the_8b_shape():
    check_write(300, 8, 128, 16, torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_gpu_int8_decode_matches_reference(num_splits):
    check_decode([1, 2, 15, 16, 17, 1000, 8191], 8, 4, 128, 16, torch.bfloat16, num_splits)


@gpu
@needs_cuda
def test_gpu_invariant_kernel_gives_a_row_the_same_bits_in_a_prefill_and_decoded_alone():
    check_invariant_row(3000, 2000, 8, 4, 128, 16, torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("invariant", [False, True])
def test_gpu_int8_prefill_matches_reference(invariant):
    seq_lens, query_lens = [1, 17, 300, 2048, 4097], [1, 17, 100, 2048, 1000]
    backend = triton_invariant if invariant else triton_backend
    check_prefill(seq_lens, query_lens, 8, 4, 128, 16, torch.bfloat16, backend)


def test_an_int8_cache_takes_its_own_measured_launches_else_fp8s(monkeypatch):
    """The same bytes a token as fp8: its launches until tune_decode.py --kv-cache-dtype int8
    has measured int8's own."""
    launch = functools.partial(decode_tiling.decode_launch, 128, True, 32)
    fp8 = {"block_n": 128, "v_in_registers": True}
    monkeypatch.setattr(decode_tiling, "measured_launches", lambda: {"fp8": {"128": fp8}})
    assert launch("int8") == launch() == decode_tiling.DecodeLaunch(128, v_in_registers=True)
    table = {"fp8": {"128": fp8}, "int8": {"128": {"block_n": 64}}}
    monkeypatch.setattr(decode_tiling, "measured_launches", lambda: table)
    assert launch("int8") == decode_tiling.DecodeLaunch(64)
    assert launch() == decode_tiling.DecodeLaunch(128, v_in_registers=True)


# ---- the engine through the Triton kernels (the interpreter on the CPU) -----------------------


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on CUDA: test_kv_int8.py's engine tests (rounding differs)"
)
# Values slots inner in 64-token blocks (the layout measured for fp8, which an int8 cache takes:
# kv_layout.values_slots_inner) and in rows in 16-token blocks; the invariant kernels read rows.
@pytest.mark.parametrize(
    "batch_invariant, slots_inner", [(False, True), (False, False), (True, False)]
)
def test_engine_through_the_triton_kernels_generates_what_the_torch_backend_does(
    tiny_model_dir, monkeypatch, batch_invariant, slots_inner
):
    """Writes, decode and prefill over an int8 cache inside whole engine steps (chunked prefill,
    batches of mixed lengths), in either layout of its values: the same greedy tokens as the
    torch reference backend (so the same in both layouts)."""
    from test_engine import PROMPTS, encode_all

    monkeypatch.setattr(decode_tiling, "fp8_v_slots_inner", lambda: slots_inner)
    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(dtype="float32", kv_cache_dtype="int8", num_blocks=64, max_num_seqs=8)
    kw |= dict(max_batch_tokens=32, batch_invariant=batch_invariant)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    triton_llm = LLM(str(tiny_model_dir), device="cpu", attention="triton", **kw)
    engine = triton_llm.engine
    assert engine.runner.attention.name.startswith("triton")
    assert engine.cfg.block_size == (64 if slots_inner else 16)
    assert v_slots_inner(engine.runner.kv[0][1]) == slots_inner
    got = [o.token_ids for o in triton_llm.generate(ids, params)]
    ref = LLM(str(tiny_model_dir), device="cpu", attention="torch", **kw).generate(ids, params)
    assert got == [o.token_ids for o in ref]
    assert len({tuple(t) for t in got}) > 1  # not one degenerate answer for all
