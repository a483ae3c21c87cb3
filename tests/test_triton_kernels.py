"""The Triton attention kernels agree with the torch reference backend.

Without CUDA the kernels run under the Triton interpreter on tiny shapes (TRITON_INTERPRET must be
set before triton is imported, hence the order below). Caches are built so that mistakes show:
block tables are random permutations, unused table entries point far outside the cache, and
every cache slot that no sequence owns holds NaN, as does every buffer the kernels allocate.
The interpreter multiplies bfloat16 as raw integers, so bfloat16 attention is covered by the
GPU-marked tests only.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from bulkgen.model.attention import torch_backend, triton_backend  # noqa: E402
from bulkgen.model.attention.metadata import AttnMetadata  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402
from bulkgen.model.attention.triton_prefill import prefill_tiles  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
UNUSED_BLOCK = 1 << 28  # a block-table entry past a sequence's end: never to be dereferenced
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def nan_buffers(monkeypatch):
    """Floating-point torch.empty returns NaN-filled tensors: unwritten outputs fail to compare."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", poisoned)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


def paged_kv(seq_lens, block_size, num_kv_heads, head_dim, dtype, num_blocks=None, width=None):
    """Random K/V for each sequence in shuffled blocks; every slot nobody owns holds NaN."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = num_blocks or sum(blocks_per_seq) + 3
    width = width or max(blocks_per_seq) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    block_tables = torch.full((len(seq_lens), width), UNUSED_BLOCK, dtype=torch.int32)
    free = torch.randperm(num_blocks)
    for b, (seq_len, n) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        blocks, free = free[:n], free[n:]
        block_tables[b, :n] = blocks.int()
        for cache in (k_cache, v_cache):
            rows = torch.randn(n * block_size, num_kv_heads, head_dim, device=DEVICE)
            rows[seq_len:] = float("nan")
            cache[blocks.to(DEVICE)] = rows.view(n, block_size, num_kv_heads, head_dim).to(dtype)
    return k_cache, v_cache, block_tables.to(DEVICE)


def metadata(seq_lens, query_lens, block_tables, decode_only=False) -> AttnMetadata:
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return AttnMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64, device=DEVICE),  # unused by attention
        query_start_loc=starts.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=block_tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        decode_only=decode_only,
        query_lens_host=list(query_lens),
        seq_lens_host=list(seq_lens),
    )


def check_prefill(seq_lens, query_lens, num_kv_heads, group, head_dim, block_size, dtype):
    k_cache, v_cache, block_tables = paged_kv(seq_lens, block_size, num_kv_heads, head_dim, dtype)
    meta = metadata(seq_lens, query_lens, block_tables)
    q = torch.randn(sum(query_lens), num_kv_heads * group, head_dim, device=DEVICE).to(dtype)
    scale = head_dim**-0.5
    out = triton_backend.paged_attention(q, k_cache, v_cache, meta, scale)
    ref = torch_backend.paged_attention(q, k_cache, v_cache, meta, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < TOLERANCE[dtype]


def check_decode(seq_lens, num_kv_heads, group, head_dim, block_size, dtype, num_splits=None):
    k_cache, v_cache, block_tables = paged_kv(seq_lens, block_size, num_kv_heads, head_dim, dtype)
    meta = metadata(seq_lens, [1] * len(seq_lens), block_tables, decode_only=True)
    q = torch.randn(len(seq_lens), num_kv_heads * group, head_dim, device=DEVICE).to(dtype)
    scale = head_dim**-0.5
    out = paged_decode(q, k_cache, v_cache, meta.seq_lens, block_tables, scale, num_splits)
    ref = torch_backend.paged_attention(q, k_cache, v_cache, meta, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert rel_err(out, ref) < TOLERANCE[dtype]


# ---- CPU (interpreter) and GPU: tiny shapes -------------------------------------------------


# The interpreter truncates float32 -> bfloat16 where the GPU rounds, so that cast is not here.
@pytest.mark.parametrize(
    "dtype, cache_dtype",
    [(torch.float32, torch.float32), (torch.float32, torch.float16), (torch.bfloat16,) * 2],
)
def test_write_kv_stores_rows_at_their_slots_and_skips_negative_slots(dtype, cache_dtype):
    num_blocks, block_size, num_kv_heads, head_dim = 6, 4, 3, 16
    width = (4 + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(7, width, device=DEVICE).to(dtype)  # a fused projection
    k = qkv[:, 4 * head_dim : 7 * head_dim].view(7, num_kv_heads, head_dim)  # strided rows
    v = qkv[:, 7 * head_dim :].view(7, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:7]
    slots[[2, 5]] = -1  # padding rows of a CUDA-graph batch
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=DEVICE).to(cache_dtype)
    v_cache = torch.randn(shape, device=DEVICE).to(cache_dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    triton_backend.write_kv(k, v, k_cache, v_cache, slots)
    torch_backend.write_kv(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize(
    "dtype, num_kv_heads, group, head_dim, block_size",
    [
        (torch.float32, 2, 1, 16, 4),
        (torch.float32, 1, 4, 32, 8),
        (torch.float16, 2, 2, 64, 16),
        (torch.float32, 2, 3, 16, 4),  # a group that does not divide the tile rows
        (torch.float32, 1, 32, 16, 8),  # a group larger than the default tile
    ],
)
def test_prefill_matches_reference_on_mixed_query_lengths(
    nan_buffers, dtype, num_kv_heads, group, head_dim, block_size
):
    # A full prompt, a decode row, a chunk after cached context, a chunk longer than a query tile.
    seq_lens = [23, 1, 40, 9, 150]
    query_lens = [23, 1, 13, 1, 70]
    check_prefill(seq_lens, query_lens, num_kv_heads, group, head_dim, block_size, dtype)


def test_prefill_with_small_query_tiles_matches_reference(nan_buffers):
    # At most 8 queries of a group of 2 heads: 16-row tiles of 8 query positions.
    assert prefill_tiles(8, 2, 32) == (8, 16, 64)
    check_prefill([5, 30, 16, 2], [5, 3, 8, 1], 2, 2, 32, 4, torch.float32)


@pytest.mark.parametrize("num_splits", [None, 1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_matches_reference_for_very_different_context_lengths(
    nan_buffers, num_splits, dtype
):
    seq_lens = [1, 2, 63, 64, 65, 300, 9]
    check_decode(seq_lens, 2, 4, 32, 4, dtype, num_splits)


@pytest.mark.parametrize("group", [1, 3, 32])
def test_decode_matches_reference_for_any_group_size(nan_buffers, group):
    check_decode([17, 1, 130], 2, group, 16, 8, torch.float32, num_splits=4)


def test_decode_padding_row_with_no_context_gives_zeros(nan_buffers):
    seq_lens = [37, 5]
    k_cache, v_cache, block_tables = paged_kv(seq_lens, 4, 2, 16, torch.float32)
    padded_lens = torch.tensor(seq_lens + [0], dtype=torch.int32, device=DEVICE)
    padded_tables = torch.cat([block_tables, block_tables[:1]])
    q = torch.randn(3, 4, 16, device=DEVICE)
    for num_splits in (1, 4):
        out = paged_decode(q, k_cache, v_cache, padded_lens, padded_tables, 0.25, num_splits)
        assert torch.equal(out[2], torch.zeros_like(out[2]))
        meta = metadata(seq_lens, [1, 1], block_tables, decode_only=True)
        ref = torch_backend.paged_attention(q[:2], k_cache, v_cache, meta, 0.25)
        assert rel_err(out[:2], ref) < TOLERANCE[torch.float32]


def test_decode_needs_no_host_lengths(nan_buffers):
    seq_lens = [12, 3, 50]
    k_cache, v_cache, block_tables = paged_kv(seq_lens, 4, 2, 32, torch.float32)
    meta = metadata(seq_lens, [1, 1, 1], block_tables, decode_only=True)
    ref_meta = metadata(seq_lens, [1, 1, 1], block_tables, decode_only=True)
    meta.query_lens_host = meta.seq_lens_host = None  # as inside a CUDA graph
    meta.max_seq_len = -1
    q = torch.randn(3, 4, 32, device=DEVICE)
    out = triton_backend.paged_attention(q, k_cache, v_cache, meta, 0.2)
    ref = torch_backend.paged_attention(q, k_cache, v_cache, ref_meta, 0.2)
    assert rel_err(out, ref) < TOLERANCE[torch.float32]


def test_unsupported_head_dim_is_refused():
    k_cache = torch.zeros(2, 4, 1, 80, device=DEVICE)
    meta = metadata([3], [3], torch.zeros(1, 1, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="head_dim"):
        triton_backend.paged_attention(
            torch.zeros(3, 1, 80, device=DEVICE), k_cache, k_cache, meta, 0.1
        )


# ---- GPU only: real shapes ------------------------------------------------------------------

GPU_SHAPES = [
    (group, head_dim, block_size)
    for group in (1, 4, 8)
    for head_dim in (64, 128)
    for block_size in (16, 32)
]


@gpu
@needs_cuda
@pytest.mark.parametrize("group, head_dim, block_size", GPU_SHAPES)
def test_gpu_prefill_matches_reference(nan_buffers, group, head_dim, block_size):
    seq_lens = [1, 17, 300, 2048, 4097, 32768]
    query_lens = [1, 17, 100, 2048, 1000, 257]
    check_prefill(seq_lens, query_lens, 2, group, head_dim, block_size, torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("group, head_dim, block_size", GPU_SHAPES)
def test_gpu_decode_matches_reference(nan_buffers, group, head_dim, block_size):
    seq_lens = [1, 2, 15, 16, 17, 1000, 8191, 32768]
    check_decode(seq_lens, 2, group, head_dim, block_size, torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gpu_other_dtypes_match_reference(nan_buffers, dtype):
    check_prefill([700, 64, 5], [300, 64, 1], 2, 4, 128, 16, dtype)
    check_decode([700, 64, 5, 1], 2, 4, 128, 16, dtype)


@gpu
@needs_cuda
def test_gpu_decode_batch_of_256_llama_shape(nan_buffers):
    seq_lens = torch.randint(1, 4097, (256,)).tolist()
    check_decode(seq_lens, 8, 4, 128, 16, torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_gpu_decode_split_counts(nan_buffers, num_splits):
    check_decode([1, 100, 5000, 20000], 8, 4, 128, 16, torch.bfloat16, num_splits)


@gpu
@needs_cuda
def test_gpu_decode_replays_in_cuda_graph_after_in_place_updates():
    batch, num_kv_heads, group, head_dim, block_size = 16, 8, 4, 128, 16
    width = 256  # blocks per sequence: up to 4096 tokens
    num_blocks = batch * width  # room for every sequence at its longest
    steps = [torch.randint(1, 4097, (batch,)).tolist() for _ in range(3)]
    steps[1][:4] = [1, 4096, 0, 2]  # includes a padding row (seq_len 0)
    dtype, scale = torch.bfloat16, head_dim**-0.5
    first = paged_kv(steps[0], block_size, num_kv_heads, head_dim, dtype, num_blocks, width)
    k_cache, v_cache, block_tables = first
    meta = metadata(steps[0], [1] * batch, block_tables, decode_only=True)
    meta.query_lens_host = meta.seq_lens_host = None
    q = torch.randn(batch, num_kv_heads * group, head_dim, device=DEVICE, dtype=dtype)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and load the kernels before capture
        triton_backend.paged_attention(q, k_cache, v_cache, meta, scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_backend.paged_attention(q, k_cache, v_cache, meta, scale)

    for seq_lens in steps:
        new = paged_kv(seq_lens, block_size, num_kv_heads, head_dim, dtype, num_blocks, width)
        for static, fresh in zip((k_cache, v_cache, block_tables), new, strict=True):
            static.copy_(fresh)
        meta.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        live = [b for b, n in enumerate(seq_lens) if n > 0]
        ref_meta = metadata([seq_lens[b] for b in live], [1] * len(live), block_tables[live], True)
        ref = torch_backend.paged_attention(q[live], k_cache, v_cache, ref_meta, scale)
        assert rel_err(out[live], ref) < TOLERANCE[dtype]
