"""The decode kernel with each tile's block ids loaded one iteration ahead
(DecodeLaunch.prefetch_blocks, triton_decode.py's PREFETCH_BLOCKS) gives its outputs bit for bit
without: the same blocks in the same order, and the block read ahead past a sequence's last tile
masked (the tables hold a block id far past the cache there, test_triton_kernels.UNUSED_BLOCK;
a padding row of length 0 reads none). Under the Triton interpreter
(no CUDA) on tiny shapes; that it compiles for sm_90, and pipelines deeper there, is
scripts/compile_check_attention.py's "decode-prefetch" (test below); its speed is measured on the
GPU (scripts/tune_decode.py, gpu_check_fp8.sh step prefetch)."""

from __future__ import annotations

import os
import re

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
from bulkgen.model.attention.kv_int8 import INT8_DTYPE, quantize  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402

pytestmark = pytest.mark.usefixtures("nan_buffers")
# Short, block-sized, one past a block, several tiles; 0 is a CUDA-graph batch's padding row.
SEQ_LENS = [1, 2, 16, 17, 63, 64, 65, 200, 9, 0]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Each cache with two of the four launches, each launch with two caches (the full product of 16
# cost 53 s of CI under the interpreter).
@pytest.mark.parametrize("cache, block_n, num_splits, v_in_registers", [
    ("fp32", 16, 1, False), ("fp32", 8, 4, False),
    ("fp8", 32, 3, False), ("fp8", 64, 2, True),
    ("fp8-slots-inner", 16, 1, False), ("fp8-slots-inner", 64, 2, True),
    ("int8", 32, 3, False), ("int8", 8, 4, False),
])  # fmt: skip
def test_prefetched_block_ids_give_the_same_outputs(cache, block_n, num_splits, v_in_registers):
    heads, group, dim, block_size = 2, 4, 32, 16
    dtype = FP8_DTYPE if cache.startswith("fp8") else torch.float32
    k, v, tables, _ = caches(SEQ_LENS, block_size, heads, dim, dtype)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    if cache == "int8":
        (k, k_scales), (v, v_scales) = quantize(k), quantize(v)
        assert k.dtype == INT8_DTYPE
        scales = {"k_scale": k_scales, "v_scale": v_scales}
    if cache == "fp8-slots-inner":
        v = slots_inner_copy(v)
    q_dtype = torch.float32 if cache == "fp32" else torch.float16
    q = torch.randn(len(SEQ_LENS), heads * group, dim, device=DEVICE).to(q_dtype)
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    launch = DecodeLaunch(block_n, v_in_registers=v_in_registers and dtype != torch.float32)
    args = (q, k, v, lens, tables, dim**-0.5, num_splits)
    plain = paged_decode(*args, launch=launch, **scales)
    ahead = paged_decode(*args, launch=launch._replace(prefetch_blocks=True), **scales)
    assert torch.equal(ahead, plain)
    assert plain[:-1].isfinite().all() and torch.equal(plain[-1], torch.zeros_like(plain[-1]))


def test_it_compiles_for_sm_90_and_pipelines_the_tiles(attention_compile_check):
    """Loaded in the same iteration, a tile's block ids keep Triton's pipeliner from buffering
    more than the tile in flight; loaded ahead, its tiles' copies are multi-buffered (compiled
    for sm_90 without a GPU: 3 stages wait for all but 2 copy groups at the loop's head)."""
    pattern = r"^(decode-\w+) +fp8 *:.* copy waits \[([\d, ]*)\]"
    waits = dict(re.findall(pattern, attention_compile_check, re.M))
    assert waits["decode-vslots"].split(", ")[0] == "0"  # every copy waited for, each tile
    assert int(waits["decode-prefetch"].split(", ")[0]) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8_DTYPE])
@pytest.mark.parametrize("rows", [32, 256])
def test_gpu_prefetching_launches_give_the_engines_outputs(kv_dtype, rows):
    """At the 8B attention shape, in the engine's layout and block size, with 3 and 4 stages:
    the same bits as the engine's own launch (pipelining moves the loads, not the arithmetic)."""
    from bulkgen.model.attention.decode_tiling import decode_launch

    fp8 = kv_dtype == FP8_DTYPE
    args, scales = engine_decode_inputs(rows, kv_dtype)
    engine = decode_launch(128, fp8, rows, "fp8" if fp8 else "auto")
    plain = paged_decode(*args, launch=engine, **scales)
    for stages in (3, 4):
        launch = engine._replace(num_stages=stages, prefetch_blocks=True)
        assert torch.equal(paged_decode(*args, launch=launch, **scales), plain), stages
