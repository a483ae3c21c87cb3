"""The fp8 cache's decode on e4m3 products (decode_mma.py, BULKGEN_FP8_DECODE_MMA): the kernel
computes exactly its stated arithmetic (the query as hi + lo / 16 e4m3 parts times a power of
two a row, the weights times 256 rounded to e4m3, float32 sums), which is attention over the
cache to within a bf16 query's precision; where it does not apply the launch is unchanged.
Under the Triton interpreter (no CUDA) on tiny shapes; on the GPU at the 8B attention shape.
"""

from __future__ import annotations

import math
import os
import re

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_layout import caches, slots_inner_copy  # noqa: E402
from test_triton_kernels import DEVICE, metadata, nan_buffers, rel_err  # noqa: E402, F401

from bulkgen.model.attention import (  # noqa: E402
    decode_mma,
    decode_tiling,
    torch_backend,
    triton_decode,  # noqa: E402
)
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.triton_decode import LOG2E, paged_decode  # noqa: E402
from bulkgen.model.switches import DECODE_MMA_ENV  # noqa: E402

pytestmark = pytest.mark.usefixtures("nan_buffers")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
E4M3 = FP8_DTYPE
K_SCALE, V_SCALE = 0.25, 3.0


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value, as float32 (torch's cast rounds to nearest even)."""
    return x.to(E4M3).float()


def split_query(q: torch.Tensor, qk_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's query parts: (hi + lo / 16) [B, H, D] and the scale [B, H, 1]."""
    y = q.float() * qk_scale
    absmax = y.abs().amax(-1, keepdim=True)
    exponent = (torch.frexp(absmax)[1] - 1 - 7).clamp(-126, 126)  # absmax / scale in [128, 256)
    scale = torch.exp2(exponent.float())
    y = y / scale
    hi = e4m3(y)
    return hi + e4m3((y - hi) * 16) / 16, scale


def emulate(q, k_cache, v_cache, seq_lens, tables, block_n, splits) -> torch.Tensor:
    """What decode_mma computes, in float32: each split's tiles in turn, the weights rounded
    against the running maximum as the kernel rounds them, the splits merged by their sums."""
    batch, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    q_parts, q_scale = split_query(q, dim**-0.5 * LOG2E * K_SCALE)
    out = torch.zeros(batch, heads, dim)
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n)
        blocks = tables[b, pos // block_size].long()
        k = k_cache[blocks, pos % block_size].float().repeat_interleave(heads // kv_heads, 1)
        v = v_cache[blocks, pos % block_size].float().repeat_interleave(heads // kv_heads, 1)
        s = torch.einsum("hd,nhd->hn", q_parts[b], k) * q_scale[b]
        tiles = math.ceil(n / block_n)
        per_split = math.ceil(tiles / splits) * block_n  # as the kernel cuts the context
        parts = []  # (max, sum, sum of weights times values) of each split that has tokens
        for lo in range(0, n, per_split):
            m, l, acc = torch.full((heads, 1), -torch.inf), torch.zeros(heads, 1), 0.0
            for start in range(lo, min(lo + per_split, n), block_n):
                tile = slice(start, min(start + block_n, n))
                m_new = torch.maximum(m, s[:, tile].amax(-1, keepdim=True))
                p = torch.exp2(s[:, tile] - m_new)
                alpha = torch.exp2(m - m_new)
                l = l * alpha + p.sum(-1, keepdim=True)
                acc = acc * alpha + torch.einsum("hn,nhd->hd", e4m3(p * 256), v[tile])
                m = m_new
            parts.append((m, l, acc / 256))
        m = torch.stack([part[0] for part in parts]).amax(0)
        weights = [torch.exp2(part[0] - m) for part in parts]
        total = sum(w * part[1] for w, part in zip(weights, parts, strict=True))
        out[b] = sum(w * part[2] for w, part in zip(weights, parts, strict=True)) / total
    return out * V_SCALE


def decode(q, k, v, lens, tables, launch, monkeypatch, mma: bool, num_splits=None):
    monkeypatch.setattr(triton_decode, "decode_launch", lambda *_: launch)
    monkeypatch.setenv(DECODE_MMA_ENV, "1" if mma else "0")
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    return paged_decode(q, k, v, lens_t, tables, q.shape[-1] ** -0.5, num_splits, **scales)


CASES = [(64, 16, 1), (64, 64, 3), (128, 16, 2), (128, 256, 1)]


@pytest.mark.parametrize("block_n, block_size, num_splits", CASES)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_decode_on_e4m3_products_computes_its_stated_arithmetic(
    monkeypatch, block_n, block_size, num_splits, q_dtype
):
    """Sequences shorter than a tile, one exactly a tile, several; splits left empty; the
    unowned slots of a block hold stale finite values (weighted by 0)."""
    seq_lens, heads, group, dim = [1, 5, 64, 65, 200, 9, 300], 2, 4, 32
    k, v, tables, _ = caches(seq_lens, block_size, heads, dim, FP8_DTYPE)
    v = slots_inner_copy(v)
    q = (torch.randn(len(seq_lens), heads * group, dim, device=DEVICE) * 3).to(q_dtype)
    q[1, 3] = 0.0  # a query row of zeros: its parts and scale stay finite
    launch = decode_tiling.DecodeLaunch(block_n, prefetch_blocks=block_n == 64)
    out = decode(q, k, v, seq_lens, tables, launch, monkeypatch, True, num_splits)
    want = emulate(q, k, v, seq_lens, tables, block_n, num_splits)
    assert out.dtype == q_dtype
    # The output's own rounding (bf16 / fp16) is all that differs from the emulation.
    assert rel_err(out, want) < {torch.bfloat16: 4e-3, torch.float16: 5e-4}[q_dtype]
    # ... which is attention over the cache to about a bf16 query's precision.
    meta = metadata(seq_lens, [1] * len(seq_lens), tables, decode_only=True)
    args = (meta, dim**-0.5, K_SCALE, V_SCALE)
    ref = torch_backend.paged_attention(q.float(), k, v.contiguous(), *args)
    assert rel_err(out, ref) < 2e-2


def test_the_16_bit_products_differ_from_the_emulation(monkeypatch):
    """The emulation's tolerance tells the two loops apart: switched off, the same launch
    misses it (so the test above measures the e4m3 loop, not the widening one)."""
    seq_lens, heads, group, dim = [200, 300], 2, 4, 32
    k, v, tables, _ = caches(seq_lens, 64, heads, dim, FP8_DTYPE)
    v = slots_inner_copy(v)
    q = (torch.randn(2, heads * group, dim, device=DEVICE) * 3).to(torch.float16)
    launch = decode_tiling.DecodeLaunch(64)
    want = emulate(q, k, v, seq_lens, tables, 64, 2)
    on = decode(q, k, v, seq_lens, tables, launch, monkeypatch, True, 2)
    off = decode(q, k, v, seq_lens, tables, launch, monkeypatch, False, 2)
    assert rel_err(on, want) < 5e-4 < rel_err(off, want)


def test_the_e4m3_loop_runs_only_where_it_applies(monkeypatch):
    k = torch.zeros(4, 64, 2, 32, dtype=FP8_DTYPE)
    inner, rows = slots_inner_copy(k), k
    q = torch.zeros(1, 8, 32, dtype=torch.bfloat16)
    monkeypatch.setenv(DECODE_MMA_ENV, "1")
    assert decode_mma.mma_fp8(q, inner, 64, pairs=False)
    assert decode_mma.mma_fp8(q.half(), inner, 128, pairs=False)
    assert not decode_mma.mma_fp8(q, rows, 64, pairs=False)  # V must be K-major: slots inner
    assert not decode_mma.mma_fp8(q, inner, 32, pairs=False)  # wgmma's M is 64 tokens
    narrow = slots_inner_copy(torch.zeros(4, 64, 2, 16, dtype=FP8_DTYPE))
    assert not decode_mma.mma_fp8(q[..., :16], narrow, 64, pairs=False)  # e4m3 products' K: 32
    assert not decode_mma.mma_fp8(q, inner, 64, pairs=True)
    assert not decode_mma.mma_fp8(q.float(), inner, 64, pairs=False)
    bf16 = slots_inner_copy(torch.zeros(4, 64, 2, 32, dtype=torch.bfloat16))
    assert not decode_mma.mma_fp8(q, bf16, 64, pairs=False)
    monkeypatch.setenv(DECODE_MMA_ENV, "0")
    assert not decode_mma.mma_fp8(q, inner, 64, pairs=False)
    monkeypatch.delenv(DECODE_MMA_ENV)
    assert decode_mma.mma_fp8(q, inner, 64, pairs=False) == decode_mma.DECODE_MMA


def test_it_compiles_to_e4m3_products_for_sm_90(attention_compile_check):
    """Compiled for sm_90 (scripts/compile_check_attention.py, the engine's 32-row launch), both
    products run on wgmma's e4m3 form and convert far fewer values than the widening loop (the
    query's parts and the weights only: 28 against 64 with Triton 3.9 at 4668d57)."""
    pattern = r"^(decode-\w+) +fp8 *:.* (\d+) e4m3 products, (\d+) e4m3 conversions$"
    found = {
        name: (int(p), int(c)) for name, p, c in re.findall(pattern, attention_compile_check, re.M)
    }
    assert found["decode-prefetch"][0] == 0 and found["decode-mma"][0] > 0, found
    assert found["decode-mma"][1] < found["decode-prefetch"][1] / 2, found


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 2, 5])
@pytest.mark.parametrize("block_n", [64, 128])
def test_gpu_decode_on_e4m3_products_matches_its_arithmetic(monkeypatch, num_splits, block_n):
    """The 8B attention shape (32 query heads over 8 kv heads, head_dim 128), 64-token blocks."""
    seq_lens = [1, 2, 63, 64, 65, 1000, 2049, 8191]
    k, v, tables, _ = caches(seq_lens, 64, 8, 128, FP8_DTYPE)
    v = slots_inner_copy(v)
    q = torch.randn(len(seq_lens), 32, 128, device=DEVICE).to(torch.bfloat16)
    launch = decode_tiling.decode_launch(128, fp8=True, batch=32)._replace(block_n=block_n)
    out = decode(q, k, v, seq_lens, tables, launch, monkeypatch, True, num_splits)
    want = emulate(q.cpu(), k.cpu(), v.cpu(), seq_lens, tables.cpu(), block_n, num_splits)
    assert rel_err(out.cpu(), want) < 4e-3
    off = decode(q, k, v, seq_lens, tables, launch, monkeypatch, False, num_splits)
    assert rel_err(out, off) < 2e-2


@pytest.mark.gpu
@needs_cuda
def test_gpu_the_engine_decodes_on_e4m3_products_in_cuda_graphs(tiny_models, monkeypatch):
    """The engine with the switch on, on a model where the loop applies (the tiny Qwen3: head_dim
    32; the tiny Llama's 16 keeps the widening loop), in CUDA graphs: its greedy tokens mostly
    agree with the switch off (random weights leave near-ties, which the e4m3 weights P and the
    query's parts may flip), and its launches did take the e4m3 loop."""
    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams

    taken = []

    def recorded(*args, **kwargs):
        taken.append(decode_mma.mma_fp8(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(triton_decode, "mma_fp8", recorded)
    model = str(tiny_models["qwen3"])
    ids = encode_all(model, PROMPTS)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    kw = dict(dtype="bfloat16", device="cuda", kv_cache_dtype="fp8", max_num_seqs=16)
    outputs = {}
    for on in ("0", "1"):
        monkeypatch.setenv(DECODE_MMA_ENV, on)
        llm = LLM(model, **kw)
        assert llm.engine.runner.graphs is not None, "decode steps must replay CUDA graphs"
        outputs[on] = [o.token_ids for o in llm.generate(ids, greedy)]
        assert any(taken) == (on == "1")
        taken.clear()
        del llm
    first = sum(a[0] == b[0] for a, b in zip(outputs["0"], outputs["1"], strict=True))
    assert first >= 0.7 * len(ids), outputs
