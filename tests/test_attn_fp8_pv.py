"""An fp8 cache's prefill P @ V on e4m3 operands (kv_fp8.FP8_PV, off by default; the switch
BULKGEN_ATTN_FP8_PV): which launches take it, its output against the torch reference (under the
interpreter without CUDA, whose fp8 cast truncates where the GPU rounds), and that it compiles
for sm_90 to tensor-core products on e4m3 operands."""

from __future__ import annotations

import os
import re

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_layout import K_SCALE, V_SCALE, caches, slots_inner_copy  # noqa: E402
from test_triton_kernels import DEVICE, metadata, nan_buffers, rel_err  # noqa: E402, F401

from bulkgen.model.attention import torch_backend  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE, fp8_pv  # noqa: E402
from bulkgen.model.attention.triton_prefill import paged_prefill  # noqa: E402

pytestmark = pytest.mark.usefixtures("nan_buffers")


def test_only_an_fp8_cache_stored_slots_inner_with_a_16_bit_query_takes_it(monkeypatch):
    q = torch.zeros(2, 8, 32, dtype=torch.float16)
    k, v, _, _ = caches([5, 9], 16, 2, 32, FP8_DTYPE)
    inner = slots_inner_copy(v)
    monkeypatch.delenv("BULKGEN_ATTN_FP8_PV", raising=False)
    assert not fp8_pv(q, inner)  # off by default
    monkeypatch.setenv("BULKGEN_ATTN_FP8_PV", "1")
    assert fp8_pv(q, inner)
    assert not fp8_pv(q, v)  # values in rows: not the K-major operand e4m3 products need
    assert not fp8_pv(q.float(), inner)
    assert not fp8_pv(q, inner.view(torch.int8))  # not an fp8 cache
    monkeypatch.setenv("BULKGEN_ATTN_FP8_PV", "maybe")
    with pytest.raises(ValueError, match="BULKGEN_ATTN_FP8_PV must be 1 or 0"):
        fp8_pv(q, inner)


@pytest.mark.parametrize("tiling", [None, (128, 128, 8, 2)])  # prefill_launch's two kinds
def test_prefill_with_e4m3_weights_matches_the_reference(monkeypatch, tiling):
    torch.manual_seed(0)
    # A chunk behind cached tokens, a whole prompt over several tiles, a decode row; blocks
    # smaller than a tile. Unowned slots hold 448 (caches): weighted by p == 0, never read.
    seq_lens, query_lens, heads, group, dim = [70, 150, 9], [40, 150, 1], 2, 4, 32
    k, v, tables, _ = caches(seq_lens, 16, heads, dim, FP8_DTYPE)
    v = slots_inner_copy(v)
    meta = metadata(seq_lens, query_lens, tables)
    q = torch.randn(sum(query_lens), heads * group, dim, device=DEVICE).to(torch.float16)
    args = (q, k, v, meta.query_start_loc, meta.seq_lens, meta.block_tables, meta.max_query_len)
    scale = dim**-0.5
    ref = torch_backend.paged_attention(q, k, v, meta, scale, K_SCALE, V_SCALE)
    monkeypatch.setenv("BULKGEN_ATTN_FP8_PV", "0")
    plain = paged_prefill(*args, scale, K_SCALE, V_SCALE, tiling=tiling)
    monkeypatch.setenv("BULKGEN_ATTN_FP8_PV", "1")
    pv = paged_prefill(*args, scale, K_SCALE, V_SCALE, tiling=tiling)
    assert not torch.equal(pv, plain)  # the weights did go through e4m3
    assert rel_err(plain, ref) < 5e-3
    # e4m3 keeps 3 mantissa bits of each weight: 0.020 here, rounded to nearest (under the
    # interpreter by the kernel's own rounding, ROUND_P); truncated by the cast it was 0.059.
    assert rel_err(pv, ref) < 3e-2, rel_err(pv, ref)
    assert pv.isfinite().all()


def test_it_compiles_to_e4m3_products_for_sm_90(attention_compile_check):
    """Compiled for sm_90, the P @ V of "prefill-pvfp8" runs on wgmma's e4m3 form and widens
    only the keys; the engine's fp8 prefill has no e4m3 product."""
    pattern = r"^(prefill-\w+) +fp8 *:.* (\d+) e4m3 products, (\d+) e4m3 conversions$"
    found = {
        name: (int(p), int(c)) for name, p, c in re.findall(pattern, attention_compile_check, re.M)
    }
    assert found["prefill-vslots"][0] == 0 and found["prefill-pvfp8"][0] > 0, found
    assert found["prefill-pvfp8"][1] < found["prefill-vslots"][1], found


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("max_query", [300, 1648])  # prefill_launch's short and long launches
def test_gpu_the_8b_shape_matches_the_reference(monkeypatch, max_query):
    # The engine's fp8 layout and block size at the 8B shape, a bf16 query; the cast rounds.
    from bulkgen.model.attention.decode_tiling import fp8_v_slots_inner
    from bulkgen.model.attention.kv_layout import block_size_for

    torch.manual_seed(0)
    seq_lens, query_lens = [max_query + 200, max_query, 9], [max_query, max_query, 1]
    block_size = block_size_for(fp8_v_slots_inner())
    k, v, tables, _ = caches(seq_lens, block_size, 8, 128, FP8_DTYPE)
    v = slots_inner_copy(v) if fp8_v_slots_inner() else v
    meta = metadata(seq_lens, query_lens, tables)
    q = torch.randn(sum(query_lens), 32, 128, device=DEVICE).to(torch.bfloat16)
    args = (q, k, v, meta.query_start_loc, meta.seq_lens, meta.block_tables, meta.max_query_len)
    ref = torch_backend.paged_attention(q, k, v, meta, 128**-0.5, K_SCALE, V_SCALE)
    monkeypatch.setenv("BULKGEN_ATTN_FP8_PV", "1")
    pv = paged_prefill(*args, 128**-0.5, K_SCALE, V_SCALE)
    assert fp8_pv(q, v) and rel_err(pv, ref) < 3e-2, rel_err(pv, ref)
