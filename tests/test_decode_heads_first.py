"""The decode grid with kv heads varying fastest (DecodeLaunch.heads_first, grid (Hkv, B, S)):
the same programs in another launch order, so the same outputs bit for bit, split or not, over
16-bit and 8-bit caches. Under the Triton interpreter on tiny shapes; at the 8B shape on a GPU.
Its speed is sweep_decode_large.py's to measure."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_layout import (  # noqa: E402
    K_SCALE,
    V_SCALE,
    caches,
    engine_decode_inputs,
    slots_inner_copy,
)
from test_triton_kernels import DEVICE, nan_buffers  # noqa: E402, F401

from bulkgen.model.attention.decode_tiling import DecodeLaunch  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402

pytestmark = pytest.mark.usefixtures("nan_buffers")
SEQ_LENS = [1, 17, 64, 65, 200, 0]  # 0: a CUDA-graph batch's padding row


@pytest.mark.parametrize("cache, num_splits", [("fp32", 1), ("fp32", 3), ("fp8", 1), ("fp8", 2)])
def test_heads_first_gives_the_same_outputs(cache, num_splits):
    torch.manual_seed(0)
    heads, group, dim = 2, 4, 32
    fp8 = cache == "fp8"
    k, v, tables, _ = caches(SEQ_LENS, 16, heads, dim, FP8_DTYPE if fp8 else torch.float32)
    if fp8:
        v = slots_inner_copy(v)
    q = torch.randn(len(SEQ_LENS), heads * group, dim, device=DEVICE)
    q = q.to(torch.float16 if fp8 else torch.float32)
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE} if fp8 else {}
    args = (q, k, v, lens, tables, dim**-0.5, num_splits)
    launch = DecodeLaunch(32 if fp8 else 16)
    plain = paged_decode(*args, launch=launch, **scales)
    first = paged_decode(*args, launch=launch._replace(heads_first=True), **scales)
    assert torch.equal(first, plain)
    assert plain[:-1].isfinite().all() and torch.equal(plain[-1], torch.zeros_like(plain[-1]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8_DTYPE])
def test_gpu_heads_first_gives_the_engines_outputs_at_600_rows(kv_dtype):
    from bulkgen.model.attention.decode_tiling import decode_launch

    torch.manual_seed(0)
    rows, fp8 = 600, kv_dtype == FP8_DTYPE
    args, scales = engine_decode_inputs(rows, kv_dtype)
    engine = decode_launch(128, fp8, rows, "fp8" if fp8 else "auto")
    plain = paged_decode(*args, launch=engine, **scales)
    first = paged_decode(*args, launch=engine._replace(heads_first=True), **scales)
    assert torch.equal(first, plain)
