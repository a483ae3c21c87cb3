"""Batch-invariant attention: a row's output is bit-identical whatever step computes it.

A target sequence's rows are computed by a whole prefill, by chunked prefill (alone and inside a
mixed step, as after a prefix-cache hit), by a decode step alone, beside five other sequences, and
padded to a CUDA-graph bucket; every one must equal the whole prefill's row bit for bit, and the
whole prefill must agree with the torch reference backend. Each step lays the sequences out in
freshly shuffled blocks with NaN in every slot not yet written (invariant_steps.py).

torch-invariant runs on the CPU; triton-invariant runs under TRITON_INTERPRET=1 without CUDA
(which multiplies bfloat16 as raw integers, so its bfloat16 case is left to the GPU) and on CUDA
with the Llama-3-8B head shapes, including a decode step replayed from a captured CUDA graph.
"""

from __future__ import annotations

import os
import re

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from invariant_steps import (  # noqa: E402
    Shape,
    attend,
    build_step,
    fill_graph_buffers,
    make_sequence,
    run_step,
)

from bulkgen.model.attention import get_backend, triton_decode, triton_prefill  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.metadata import DecodeGraphBuffers  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU = torch.device("cpu")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
pytestmark = pytest.mark.usefixtures("rowwise_interpreted_dots")  # bits, not BLAS

# The target is 150 tokens long: three 64-key tiles, the last one partial; the chunk ends are
# not multiples of a query tile, so a position sits at another row of its tile in each step.
LENGTH, CHUNK_ENDS, PREFIX_HIT = 150, (50, 101, 150), 96
OTHER_LENGTHS = (5, 64, 65, 1, 23)
CASES = [
    pytest.param("torch", Shape(2, 4, 32, 16, f32, f32), id="torch-fp32"),
    # The tiny test models' heads: here the default torch backend's decode row is not its prefill
    # row (the einsums' blocking differs), so this case shows the checks can fail.
    pytest.param("torch", Shape(2, 2, 16, 16, f32, f32), id="torch-fp32-group2-d16"),
    pytest.param("torch", Shape(2, 4, 32, 16, bf16, bf16), id="torch-bf16"),
    pytest.param("torch", Shape(2, 4, 32, 16, f32, FP8_DTYPE), id="torch-fp8-cache"),
    pytest.param("torch", Shape(2, 4, 32, 16, f32, torch.int8), id="torch-int8-cache"),
    pytest.param("triton", Shape(2, 4, 32, 16, f32, f32), id="triton-fp32"),
    pytest.param("triton", Shape(2, 4, 32, 16, f16, f16), id="triton-fp16"),
    pytest.param("triton", Shape(2, 4, 32, 16, f16, FP8_DTYPE), id="triton-fp8-cache"),
    pytest.param("triton", Shape(2, 4, 32, 16, f16, torch.int8), id="triton-int8-cache"),
    pytest.param(
        "triton",
        Shape(2, 4, 32, 16, bf16, bf16),
        id="triton-bf16",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(),
            reason="the Triton interpreter multiplies bfloat16 as raw integers",
        ),
    ),
]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def device_of(name: str) -> torch.device:
    return CPU if name == "torch" else DEVICE


def whole_prefill(backend, target, shape, device) -> torch.Tensor:
    (out,) = run_step(backend, [(target, LENGTH, LENGTH)], shape, device)
    return out


def test_get_backend_names_the_invariant_variants():
    assert get_backend("torch", CPU, batch_invariant=True).name == "torch-invariant"
    assert get_backend("auto", CPU, batch_invariant=True).name == "torch-invariant"
    triton = get_backend("triton", CPU, batch_invariant=True)
    assert triton.name == "triton-invariant" and triton.graph_safe
    assert get_backend("torch", CPU).name == "torch"


@pytest.mark.parametrize("name, shape", CASES)
def test_whole_prefill_agrees_with_the_reference_backend(name, shape):
    device = device_of(name)
    backend = get_backend(name, device, batch_invariant=True)
    other = make_sequence(40, shape, device)
    target = make_sequence(LENGTH, shape, device)
    step = build_step([(other, 40, 40), (target, LENGTH, LENGTH)], shape, device)
    out, ref = attend(backend, step, shape), attend(get_backend("torch", device), step, shape)
    assert out.dtype == step.q.dtype and out.shape == step.q.shape
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < TOLERANCE[shape.dtype]


@pytest.mark.parametrize("name, shape", CASES)
def test_chunked_prefill_gives_the_whole_prefills_rows_bit_for_bit(name, shape):
    device = device_of(name)
    backend = get_backend(name, device, batch_invariant=True)
    target = make_sequence(LENGTH, shape, device)
    whole = whole_prefill(backend, target, shape, device)
    chunks, start = [], 0
    for end in CHUNK_ENDS:
        chunks += run_step(backend, [(target, end, end - start)], shape, device)
        start = end
    assert torch.equal(torch.cat(chunks), whole)
    # A prefix-cache hit: the query starts at PREFIX_HIT, in a mixed step with other sequences.
    prompt, decoding = make_sequence(30, shape, device), make_sequence(65, shape, device)
    parts = [(prompt, 30, 30), (target, LENGTH, LENGTH - PREFIX_HIT), (decoding, 65, 1)]
    _, hit, _ = run_step(backend, parts, shape, device)
    assert torch.equal(hit, whole[PREFIX_HIT:])


@pytest.mark.parametrize("name, shape", CASES)
def test_decode_gives_the_prefills_row_alone_in_a_batch_and_padded(name, shape):
    device = device_of(name)
    backend = get_backend(name, device, batch_invariant=True)
    target = make_sequence(LENGTH, shape, device)
    last = whole_prefill(backend, target, shape, device)[-1:]
    (alone,) = run_step(backend, [(target, LENGTH, 1)], shape, device)
    assert torch.equal(alone, last)
    others = [(make_sequence(n, shape, device), n, 1) for n in OTHER_LENGTHS]
    batch = others[:2] + [(target, LENGTH, 1)] + others[2:]
    assert torch.equal(run_step(backend, batch, shape, device)[2], last)
    # A graph bucket of 8 rows: the last two are padding (no slot, one token of a stale block).
    assert torch.equal(run_step(backend, batch, shape, device, pad_to=8)[2], last)


def test_triton_invariant_launches_one_kernel_with_one_tiling_for_every_step(monkeypatch):
    """The interpreter computes every tile shape alike, so it cannot see a tiling that follows
    the step: the launches must show there is none (and no split decode kernel)."""
    launches = []
    kernel = triton_prefill._prefill_kernel

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs)
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(triton_prefill, "_prefill_kernel", Recorder())
    monkeypatch.setattr(triton_decode, "_decode_split_kernel", None)
    shape = Shape(2, 4, 32, 16, f32, f32)
    backend = get_backend("triton", DEVICE, batch_invariant=True)
    seqs = [make_sequence(n, shape, DEVICE) for n in (70, 9)]
    for parts, pad_to in [
        ([(seqs[0], 70, 70)], None),  # a whole prefill: max_query_len 70
        ([(seqs[0], 70, 1), (seqs[1], 9, 1)], None),  # decode
        ([(seqs[0], 70, 1), (seqs[1], 9, 1)], 4),  # decode padded to a graph bucket
        ([(seqs[0], 70, 1), (seqs[1], 9, 5)], None),  # mixed
    ]:
        run_step(backend, parts, shape, DEVICE, pad_to)
    assert len(launches) == 4 and all(kwargs == launches[0] for kwargs in launches)
    tiling = {k: launches[0][k] for k in ("BLOCK_Q", "BLOCK_M", "BLOCK_N", "num_warps")}
    assert tiling == dict(BLOCK_Q=4, BLOCK_M=16, BLOCK_N=64, num_warps=4)
    assert launches[0]["INVARIANT"]


def test_triton_invariant_kernel_compiles_for_sm90_with_one_kv_loop(attention_compile_check):
    """The GPU compiler accepts the invariant variant, and it streams K/V through one loop (the
    default prefill has an unmasked and a masked one; both have the binary search's)."""
    loops = dict(re.findall(r"^(\w+ +\w+) *:.* (\d+) loops,", attention_compile_check, re.M))
    loops = {" ".join(k.split()): int(v) for k, v in loops.items()}
    for cache in ("bf16", "fp8"):
        assert loops[f"invariant {cache}"] == 2 and loops[f"prefill {cache}"] == 3, loops


# ---- GPU only: the Llama-3-8B head shapes ----------------------------------------------------

GPU_SHAPES = [
    pytest.param(Shape(8, 4, 128, 16, bf16, bf16), id="bf16"),
    pytest.param(Shape(8, 4, 128, 16, bf16, FP8_DTYPE), id="fp8-cache"),
]


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "shape", [*GPU_SHAPES, pytest.param(Shape(8, 4, 128, 16, bf16, torch.int8), id="int8-cache")]
)
def test_gpu_every_step_kind_gives_the_same_rows_at_the_8b_shape(shape):
    backend = get_backend("triton", DEVICE, batch_invariant=True)
    length = 3000
    target = make_sequence(length, shape, DEVICE)
    (whole,) = run_step(backend, [(target, length, length)], shape, DEVICE)
    ref_step = build_step([(target, length, length)], shape, DEVICE)
    ref = attend(get_backend("torch", DEVICE), ref_step, shape)
    assert ((whole.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2
    chunks, start = [], 0
    for end in (517, 2048, 2049, length):  # a one-token chunk too
        chunks += run_step(backend, [(target, end, end - start)], shape, DEVICE)
        start = end
    assert torch.equal(torch.cat(chunks), whole)
    lengths = torch.randint(1, 4097, (255,)).tolist()
    others = [(make_sequence(n, shape, DEVICE), n, 1) for n in lengths]
    for batch in ([], others[:5], others):  # alone, beside 5, in a batch of 256
        parts = batch[: len(batch) // 2] + [(target, length, 1)] + batch[len(batch) // 2 :]
        out = run_step(backend, parts, shape, DEVICE)[len(batch) // 2]
        assert torch.equal(out, whole[-1:]), f"decode beside {len(batch)} sequences"


@gpu
@needs_cuda
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_decode_replayed_from_a_cuda_graph_with_padding_rows_gives_the_prefills_row(shape):
    backend = get_backend("triton", DEVICE, batch_invariant=True)
    length, bucket = 1000, 16
    target = make_sequence(length, shape, DEVICE)
    (whole,) = run_step(backend, [(target, length, length)], shape, DEVICE)
    others = [(make_sequence(n, shape, DEVICE), n, 1) for n in (1, 17, 4000, 700, 64, 3)]
    steps = [others[:2] + [(target, length, 1)], [(target, length, 1)] + others]
    width = 4000 // 16 + 2  # block-table columns: the graph's static width
    layouts = [build_step(parts, shape, DEVICE, width=width) for parts in steps]
    # Static tensors the graph captures, sized for every layout; each replay refills them.
    num_blocks = max(s.k_cache.shape[0] for s in layouts)
    k_cache = torch.zeros(num_blocks, *layouts[0].k_cache.shape[1:], device=DEVICE)
    k_cache, v_cache = k_cache.to(shape.cache_dtype), k_cache.to(shape.cache_dtype)
    buffers = DecodeGraphBuffers(bucket, width, DEVICE)
    q = torch.zeros(bucket, shape.num_q_heads, shape.head_dim, dtype=shape.dtype, device=DEVICE)
    k_scale, v_scale = shape.scales
    args = (q, k_cache, v_cache, buffers.view(bucket), shape.head_dim**-0.5, k_scale, v_scale)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and load the kernel before capture
        backend.attend(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.attend(*args)
    for parts, step in zip(steps, layouts, strict=True):
        for static, fresh in ((k_cache, step.k_cache), (v_cache, step.v_cache)):
            static[: fresh.shape[0]].copy_(fresh)
        fill_graph_buffers(buffers, step.meta, bucket)  # rows len(parts).. are padding
        q[: len(parts)].copy_(step.q)
        q[len(parts) :].normal_()
        graph.replay()
        row = next(i for i, (seq, _, _) in enumerate(parts) if seq is target)
        assert torch.equal(out[row : row + 1], whole[-1:])
