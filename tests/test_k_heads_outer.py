"""Keys stored heads outer (kv_layout.py, BULKGEN_K_HEADS_OUTER, an experiment): the Triton
kernels take K's strides, so decode, prefill and the KV write (test_kv_layout.py) give the same
bits over such a cache as over rows, with values in either layout; the allocation's views and
the switch. Under the Triton interpreter (no CUDA) on tiny shapes; on the GPU at the 8B
attention shape. Whether it reads faster is gpu_check_fp8.sh's step kheads to measure."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_layout import (  # noqa: E402
    CASES,
    caches,
    engine_decode_inputs,
    heads_outer_copy,
    slots_inner_copy,
)
from test_triton_kernels import DEVICE, metadata, nan_buffers  # noqa: E402, F401

from bulkgen.model.attention import get_backend, triton_backend  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.kv_layout import (  # noqa: E402
    allocate_kv_cache,
    k_heads_outer,
)
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402
from bulkgen.model.switches import K_HEADS_OUTER_ENV  # noqa: E402

pytestmark = pytest.mark.usefixtures("nan_buffers")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("cache_dtype, q_dtype", CASES)
@pytest.mark.parametrize("num_splits, block_size, slots_inner", [(1, 8, False), (3, 16, True)])
def test_decode_reads_keys_stored_heads_outer_as_rows(
    cache_dtype, q_dtype, num_splits, block_size, slots_inner
):
    seq_lens, heads, group, dim = [1, 5, 16, 17, 40, 9, 0], 2, 4, 32
    k, v, tables, scales = caches(seq_lens, block_size, heads, dim, cache_dtype)
    v = slots_inner_copy(v) if slots_inner and cache_dtype != torch.float32 else v
    q = torch.randn(len(seq_lens), heads * group, dim, device=DEVICE).to(q_dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    args = (tables, dim**-0.5, num_splits)
    rows = paged_decode(q, k, v, lens, *args, **scales)
    outer = paged_decode(q, heads_outer_copy(k), v, lens, *args, **scales)
    assert torch.equal(outer, rows)


@pytest.mark.parametrize("cache_dtype, q_dtype", CASES)
def test_prefill_reads_keys_stored_heads_outer_as_rows(cache_dtype, q_dtype):
    seq_lens, query_lens = [30, 12, 5, 19], [30, 1, 2, 7]
    heads, group, dim, block_size = 2, 2, 32, 8
    k, v, tables, scales = caches(seq_lens, block_size, heads, dim, cache_dtype)
    meta = metadata(seq_lens, query_lens, tables)
    q = torch.randn(sum(query_lens), heads * group, dim, device=DEVICE).to(q_dtype)
    args = (meta, dim**-0.5, scales["k_scale"], scales["v_scale"])
    rows = triton_backend.paged_attention(q, k, v, *args)
    outer = triton_backend.paged_attention(q, heads_outer_copy(k), v, *args)
    assert torch.equal(outer, rows)


def test_the_allocation_views_keys_heads_outer_in_the_logical_shape():
    layers, blocks, block_size, heads, dim = 2, 4, 8, 2, 16
    cpu = torch.device("cpu")
    shape = (layers, blocks, block_size, heads, dim)
    storage, _, views = allocate_kv_cache(*shape, FP8_DTYPE, cpu, True, k_heads_outer=True)
    for layer, (k, _) in enumerate(views):
        assert k.shape == (blocks, block_size, heads, dim) and k_heads_outer(k)
        assert k.data_ptr() == storage[layer, 0].data_ptr()
        k[1, 3, 1] = 1.0  # block 1, slot 3, head 1: at (1 * heads + 1) * block_size + 3 rows
        flat = storage[layer, 0].view(blocks * heads * block_size, dim)
        assert flat[(1 * heads + 1) * block_size + 3].float().eq(1.0).all()


def test_the_switch_reaches_the_plain_triton_backend_only(monkeypatch):
    cpu = torch.device("cpu")
    assert not get_backend("triton", cpu).k_heads_outer, "off by default"
    monkeypatch.setenv(K_HEADS_OUTER_ENV, "1")
    assert get_backend("triton", cpu).k_heads_outer
    assert not get_backend("triton", cpu, batch_invariant=True).k_heads_outer
    assert not get_backend("torch", cpu).k_heads_outer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8_DTYPE])
def test_gpu_decode_and_prefill_read_keys_heads_outer_as_rows(kv_dtype):
    (q, k, v, lens, tables, scale), scales = engine_decode_inputs(600, kv_dtype)
    rows = paged_decode(q, k, v, lens, tables, scale, **scales)
    assert torch.equal(paged_decode(q, heads_outer_copy(k), v, lens, tables, scale, **scales), rows)
    seq_lens = lens[:3].tolist()
    meta = metadata(seq_lens, [min(n, 300) for n in seq_lens], tables[:3])
    q = torch.randn(int(meta.query_start_loc[-1]), 32, 128, device=DEVICE).bfloat16()
    args = (meta, scale, scales.get("k_scale", 1.0), scales.get("v_scale", 1.0))
    rows = triton_backend.paged_attention(q, k, v, *args)
    assert torch.equal(triton_backend.paged_attention(q, heads_outer_copy(k), v, *args), rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU: the Triton kernels interpreted")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_the_engine_generates_the_same_tokens_with_keys_heads_outer(
    tiny_model_dir, allow_fp8, monkeypatch, kv_cache_dtype
):
    """The engine's own cache, write, chunked prefill and mixed batches through the Triton
    kernels (interpreter) with the switch off and on: the same greedy tokens."""
    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams

    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(dtype="float32", kv_cache_dtype=kv_cache_dtype, max_num_seqs=8, max_batch_tokens=32)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = {}
    for on in ("0", "1"):
        monkeypatch.setenv(K_HEADS_OUTER_ENV, on)
        llm = LLM(str(tiny_model_dir), device="cpu", attention="triton", num_blocks=64, **kw)
        assert k_heads_outer(llm.engine.runner.kv[0][0]) == (on == "1")
        outs[on] = [o.token_ids for o in llm.generate(ids, params)]
    assert outs["1"] == outs["0"]
    assert len({tuple(t) for t in outs["1"]}) > 1  # not one degenerate answer for all


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_gpu_the_engine_generates_the_same_tokens_with_keys_heads_outer(
    tiny_model_dir, monkeypatch, kv_cache_dtype
):
    """On CUDA: decode graphs, the mixed steps' pieces, the rotary and KV write in one launch
    and, where the step allows, in the decode launch; the switch off and on, the same tokens."""
    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams

    ids = encode_all(tiny_model_dir, PROMPTS)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outs = {}
    for on in ("0", "1"):
        monkeypatch.setenv(K_HEADS_OUTER_ENV, on)
        llm = LLM(str(tiny_model_dir), device="cuda", dtype="bfloat16", max_num_seqs=16,
                  kv_cache_dtype=kv_cache_dtype)  # fmt: skip
        assert k_heads_outer(llm.engine.runner.kv[0][0]) == (on == "1")
        outs[on] = [o.token_ids for o in llm.generate(ids, params)]
        llm.close()
    assert outs["1"] == outs["0"]
