"""Split decode's fused merge (decode_merge.py): the last of a (sequence, kv head)'s split
programs merges their partials in the same launch, giving the outputs of the second launch
(merge_splits) bit for bit, for 16-bit, fp8 and int8 caches, any group size, splits past a
short sequence's end and a padding row of length 0; and it leaves its counters at zero, so the
next launch (the next layer, the next CUDA-graph replay) starts from zero. Under the Triton
interpreter (no CUDA), where programs run one after another: the last to count in is the last
split; on the GPU any may be (the GPU test at the end, and scripts/gpu_check.sh)."""

from __future__ import annotations

import functools
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_decode_prefetch import SEQ_LENS  # noqa: E402
from test_kv_layout import K_SCALE, V_SCALE, caches  # noqa: E402
from test_triton_kernels import DEVICE, nan_buffers  # noqa: E402, F401

from bulkgen.model.attention import decode_merge  # noqa: E402
from bulkgen.model.attention.decode_tiling import DecodeLaunch  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.kv_int8 import quantize  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402

pytestmark = pytest.mark.usefixtures("nan_buffers")


def decode_inputs(cache, group, seq_lens, heads=2, dim=32, block_size=16):
    """q and paged_decode's next arguments (caches, lengths, tables, scale), the scales."""
    torch.manual_seed(0)
    dtype = {"fp8": FP8_DTYPE, "bf16": torch.bfloat16}.get(cache, torch.float32)
    k, v, tables = caches(seq_lens, block_size, heads, dim, dtype)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    if cache == "int8":
        (k, k_scales), (v, v_scales) = quantize(k), quantize(v)
        scales = {"k_scale": k_scales, "v_scale": v_scales}
    q_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(cache, torch.float16)
    q = torch.randn(len(seq_lens), heads * group, dim, device=DEVICE).to(q_dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    return q, (k, v, lens, tables, dim**-0.5), scales


def decode_both_ways(cache, group, num_splits, block_n=16):
    q, args, scales = decode_inputs(cache, group, SEQ_LENS)
    launch = DecodeLaunch(block_n)
    fused = paged_decode(q, *args, num_splits, launch=launch, fused=True, **scales)
    second = paged_decode(q, *args, num_splits, launch=launch, fused=False, **scales)
    return fused, second


@pytest.mark.parametrize("cache, group, num_splits", [
    ("fp32", 4, 2), ("fp32", 1, 3), ("fp32", 8, 4), ("fp8", 4, 2), ("fp8", 2, 5), ("int8", 4, 3),
])  # fmt: skip
def test_fused_merge_gives_the_second_launchs_bits(cache, group, num_splits):
    fused, second = decode_both_ways(cache, group, num_splits)
    assert torch.equal(fused, second)
    assert fused[:-1].isfinite().all() and torch.equal(fused[-1], torch.zeros_like(fused[-1]))
    counters = decode_merge._COUNTERS[torch.device(DEVICE)][-1]
    assert not counters.any()  # every count zeroed for the next launch


def test_fused_merge_matches_one_split():
    """The merge itself is right: split over 4 it equals the unsplit kernel up to rounding."""
    fused, _ = decode_both_ways("fp32", 4, 4)
    whole, _ = decode_both_ways("fp32", 4, 1)
    torch.testing.assert_close(fused, whole, rtol=1e-5, atol=1e-5)


def test_counters_grow_and_keep_the_old_buffers(monkeypatch):
    """A larger launch gets a larger buffer; the smaller one stays alive (a CUDA graph captured
    with it still uses it)."""
    device = torch.device("cpu")
    monkeypatch.setattr(decode_merge, "_COUNTERS", {})
    small = decode_merge.merge_counters(10, device)
    assert small.numel() >= 10 and decode_merge.merge_counters(9, device) is small
    large = decode_merge.merge_counters(5000, device)
    assert large.numel() >= 5000 and large is not small
    assert decode_merge._COUNTERS[device] == [small, large]


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(decode_merge.FUSED_MERGE_ENV, "0")
    assert not decode_merge.fused_merge()
    monkeypatch.setenv(decode_merge.FUSED_MERGE_ENV, "1")
    assert decode_merge.fused_merge()
    monkeypatch.delenv(decode_merge.FUSED_MERGE_ENV)
    assert decode_merge.fused_merge() is decode_merge.FUSED_MERGE


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_gpu_fused_merge_in_a_cuda_graph_at_blogs_shape(cache):
    """32 rows of 1-2K context at the 8B attention shape (8 kv heads of 4 query heads, head_dim
    128, 64-token tiles, 4 splits), bf16 and fp8 caches: the fused merge, where any program may
    count in last, gives the second launch's bits eagerly and over 20 replays of one CUDA graph,
    each after new queries are copied in."""
    lens = [1024 + 37 * i for i in range(32)]
    q, args, scales = decode_inputs(cache, 4, lens, heads=8, dim=128)
    launch = DecodeLaunch(64)
    decode = functools.partial(paged_decode, q, *args, 4, launch=launch, **scales)
    assert torch.equal(decode(fused=True), decode(fused=False))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = decode(fused=True)
    for _ in range(20):
        q.copy_(torch.randn_like(q))
        graph.replay()
        assert torch.equal(replayed, decode(fused=False))
