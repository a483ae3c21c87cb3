"""The Triton kernels over an fp8 cache with paired first blocks (model/attention/kv_pairs.py)
agree with the torch reference: the write stores the same bytes in both blocks of a pair, and
decode and prefill attention read hi + lo where the reference does. Under the Triton interpreter
on the CPU (tiny shapes), on the GPU as they are."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_fp8_kernels import K_SCALE, TOLERANCE, V_SCALE, e4m3_grid_values  # noqa: E402
from test_triton_kernels import DEVICE, metadata, paged_kv, rel_err  # noqa: E402

from bulkgen.model.attention import torch_backend, triton_backend  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE, quantize  # noqa: E402
from bulkgen.model.attention.kv_layout import to_slots_inner  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("slots_inner", [False, True])
def test_the_write_stores_the_references_bytes_in_both_blocks_of_a_pair(slots_inner):
    blocks, bs, heads, dim = 6, 8, 2, 16
    partners = torch.full((blocks,), -1, dtype=torch.int32, device=DEVICE)
    partners[2] = 5
    # Block 2's slots take any value (a pair's parts are rounded exactly on the interpreter
    # too); block 3's, unpaired, values on the e4m3 grid (the interpreter's own cast is off).
    slots = torch.tensor([16, 17, 20, 23, 24, 30], device=DEVICE)
    k = torch.randn(6, heads, dim, device=DEVICE) * 20
    v = torch.randn(6, heads, dim, device=DEVICE)
    k[3:] = e4m3_grid_values(3 * heads * dim).view(3, heads, dim).to(DEVICE) * K_SCALE
    v[3:] = e4m3_grid_values(3 * heads * dim).view(3, heads, dim).to(DEVICE) * V_SCALE
    shape = (blocks, bs, heads, dim)
    k_cache = torch.zeros(shape, device=DEVICE).to(FP8_DTYPE)
    v_ref = torch.zeros(shape, device=DEVICE).to(FP8_DTYPE)
    k_ref = k_cache.clone()
    v_cache = to_slots_inner(v_ref) if slots_inner else v_ref.clone()
    args = (slots, K_SCALE, V_SCALE)
    triton_backend.write_kv(k, v, k_cache, v_cache, *args, partners=partners)
    torch_backend.write_kv(k, v, k_ref, v_ref, *args, partners=partners)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.contiguous().view(torch.uint8), v_ref.view(torch.uint8))
    assert k_ref[5].float().abs().sum() > 0, "the low parts went to the partner"


def paired_cache(seq_lens, block_size, heads, dim, slots_inner):
    """An fp8 cache of random values (paged_kv's layout, unowned slots NaN; zero with values
    slots inner, as the engine's zeroed cache), each sequence's first block paired with a block
    of its own, written by the reference."""
    k, v, tables = paged_kv(seq_lens, block_size, heads, dim, torch.float32)
    extra = len(seq_lens)
    num_blocks = k.shape[0] + extra
    shape = (num_blocks, block_size, heads, dim)
    fill = 0.0 if slots_inner else float("nan")
    k_cache = torch.full(shape, fill, device=DEVICE).to(FP8_DTYPE)
    v_cache = torch.full(shape, fill, device=DEVICE).to(FP8_DTYPE)
    partners = torch.full((num_blocks,), -1, dtype=torch.int32, device=DEVICE)
    partners[tables[:, 0].long()] = torch.arange(k.shape[0], num_blocks, device=DEVICE).int()
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n, device=DEVICE)
        slots = tables[b, pos // block_size].long() * block_size + pos % block_size
        rows_k = k.view(-1, heads, dim)[slots] * K_SCALE * 4
        rows_v = v.view(-1, heads, dim)[slots] * V_SCALE
        args = (k_cache, v_cache, slots, K_SCALE, V_SCALE)
        torch_backend.write_kv(rows_k, rows_v, *args, partners=partners)
    v_kernel = to_slots_inner(v_cache) if slots_inner else v_cache
    return k_cache, v_cache, v_kernel, tables, partners


@pytest.mark.parametrize("slots_inner", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_and_prefill_read_pairs_as_the_reference_does(slots_inner, dtype):
    seq_lens, query_lens, block_size = [3, 16, 40, 71, 130], [3, 1, 17, 1, 60], 16
    k_cache, v_cache, v_kernel, tables, partners = paired_cache(
        seq_lens, block_size, 2, 32, slots_inner
    )
    for q_lens, decode in ((query_lens, False), ([1] * len(seq_lens), True)):
        meta = metadata(seq_lens, q_lens, tables, decode_only=decode)
        meta.kv_partners = partners
        q = torch.randn(sum(q_lens), 8, 32, device=DEVICE).to(dtype)
        scales = (32**-0.5, K_SCALE, V_SCALE)
        out = triton_backend.paged_attention(q, k_cache, v_kernel, meta, *scales)
        ref = torch_backend.paged_attention(q, k_cache, v_cache, meta, *scales)
        assert rel_err(out, ref) < TOLERANCE[dtype], (decode, rel_err(out, ref))
        meta.kv_partners = None  # hi alone: the low parts were read above
        unpaired = torch_backend.paged_attention(q, k_cache, v_cache, meta, *scales)
        assert rel_err(unpaired, ref) > 10 * rel_err(out, ref), decode


def test_pairs_take_no_effect_without_an_fp8_cache():
    seq_lens = [5, 20]
    k, v, tables = paged_kv(seq_lens, 8, 2, 16, torch.float32)
    meta = metadata(seq_lens, [1, 1], tables, decode_only=True)
    q = torch.randn(2, 4, 16, device=DEVICE)
    plain = triton_backend.paged_attention(q, k, v, meta, 0.25)
    meta.kv_partners = torch.zeros(k.shape[0], dtype=torch.int32, device=DEVICE)
    assert torch.equal(triton_backend.paged_attention(q, k, v, meta, 0.25), plain)
    assert quantize(torch.ones(1), 1.0).dtype == FP8_DTYPE


def test_a_paired_decode_launch_bounds_its_registers_on_cuda_only():
    from bulkgen.model.attention.triton_kv_pairs import PAIRS_MAX_REGISTERS, pairs_registers

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pairs_registers(True, 4, cuda) == {"maxnreg": PAIRS_MAX_REGISTERS}
    assert pairs_registers(False, 4, cuda) == pairs_registers(True, 4, cpu) == {}
    assert pairs_registers(True, 8, cuda) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 32, 300])
def test_gpu_paired_kernels_match_the_reference_at_the_8b_shape(rows):
    """The engine's launches (tuned tiles, the register bound of pairs_registers, values slots
    inner in 64-token blocks) at the 8B's head shape, decode and a mixed step's prefill."""
    seq_lens = torch.randint(1, 2048, (rows,)).tolist()
    seq_lens[0] = 64  # exactly the first block
    k_cache, v_cache, v_kernel, tables, partners = paired_cache(seq_lens, 64, 8, 128, True)
    scales = (128**-0.5, K_SCALE, V_SCALE)
    query_lens = [min(n, 1 if i % 2 else 300) for i, n in enumerate(seq_lens)]
    for q_lens, decode in (([1] * rows, True), (query_lens, False)):
        meta = metadata(seq_lens, q_lens, tables, decode_only=decode)
        meta.kv_partners = partners
        q = torch.randn(sum(q_lens), 32, 128, device=DEVICE).to(torch.bfloat16)
        out = triton_backend.paged_attention(q, k_cache, v_kernel, meta, *scales)
        ref = torch_backend.paged_attention(q, k_cache, v_cache, meta, *scales)
        assert rel_err(out, ref) < TOLERANCE[torch.bfloat16], (rows, decode, rel_err(out, ref))
