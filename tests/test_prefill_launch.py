"""The prefill kernel's launch by step shape (prefill_tiling.prefill_launch): long queries take
the large tiles timed on the H200, others the short launch; both agree with the torch reference
(under the interpreter without CUDA, the long threshold lowered to tiny shapes)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_fp8_kernels import check_fp8_prefill  # noqa: E402
from test_triton_kernels import check_prefill, nan_buffers  # noqa: E402, F401

from bulkgen.model.attention import prefill_tiling  # noqa: E402
from bulkgen.model.attention.prefill_tiling import FP8_STAGES, prefill_launch  # noqa: E402

pytestmark = pytest.mark.usefixtures("nan_buffers")


def test_long_queries_take_the_large_tiles_where_they_were_timed():
    long = (32, 128, 128, 8, 2)  # group 4: 32 query positions x 4 heads a tile
    assert prefill_launch(1648, 4, 128, fp8=False, long_ok=True) == long
    assert prefill_launch(1024, 4, 128, fp8=True, long_ok=True) == long
    assert prefill_launch(1023, 4, 128, fp8=False, long_ok=True) == (16, 64, 64, 4, 0)
    assert prefill_launch(800, 4, 128, fp8=True, long_ok=True) == (16, 64, 64, 4, FP8_STAGES)
    # Not timed: a float32 query or an int8 cache (long_ok False), another head size, a group
    # that does not divide the tile's rows.
    assert prefill_launch(2048, 4, 128, fp8=False, long_ok=False) == (16, 64, 64, 4, 0)
    assert prefill_launch(2048, 4, 64, fp8=False, long_ok=True) == (16, 64, 64, 4, 0)
    assert prefill_launch(2048, 3, 128, fp8=False, long_ok=True)[1:] == (64, 64, 4, 0)


@pytest.mark.parametrize("cache", ["fp16", "fp8"])
def test_the_long_launch_matches_the_reference(monkeypatch, cache):
    launches = []

    def spy(*args):
        launches.append(launch(*args))
        return launches[-1]

    launch = prefill_tiling.prefill_launch
    monkeypatch.setattr(prefill_tiling, "prefill_launch", spy)
    monkeypatch.setattr(prefill_tiling, "LONG_QUERY", 16)
    # A chunk behind cached tokens, a whole prompt longer than a tile, a decode row.
    seq_lens, query_lens = [70, 150, 9], [40, 150, 1]
    if cache == "fp8":
        check_fp8_prefill(seq_lens, query_lens, 2, 4, 128, 16, torch.float16)
    else:
        check_prefill(seq_lens, query_lens, 2, 4, 128, 16, torch.float16)
    assert launches and all(launch[1:3] == (128, 128) for launch in launches)
