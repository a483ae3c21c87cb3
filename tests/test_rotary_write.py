"""Rotary and the KV-cache write in one launch (rotary_write.py) give the same bits as the two
launches they replace (fused_rotary.rotary, then triton_kv_write.write_kv), for every cache the
Triton backend writes; the backend offers it on CUDA only. Under the Triton interpreter without CUDA
(TRITON_INTERPRET set before any kernel is defined), and compiled for sm_90.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_triton_kernels import DEVICE  # noqa: E402

from bulkgen.model.attention import get_backend  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.kv_int8 import allocate_kv_scales  # noqa: E402
from bulkgen.model.attention.kv_layout import to_slots_inner  # noqa: E402
from bulkgen.model.attention.rotary_write import rotary_write_kv  # noqa: E402
from bulkgen.model.attention.triton_kv_write import write_kv  # noqa: E402
from bulkgen.model.fused_rotary import rotary  # noqa: E402

Q_HEADS, KV_HEADS, DIM, BLOCK, NUM_BLOCKS = 8, 2, 32, 4, 6


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def step_inputs(tokens: int, dtype: torch.dtype):
    """q, k, v as views of one fused projection's rows (strided, as the model's are), positions,
    float32 cos/sin tables, and slots (one of them a CUDA-graph padding row: -1)."""
    qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * DIM, device=DEVICE).to(dtype)
    q, k, v = qkv.split([Q_HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=-1)
    q, k, v = (x.view(tokens, -1, DIM) for x in (q, k, v))
    positions = torch.randint(0, 64, (tokens,), device=DEVICE)
    angles = torch.rand(64, DIM // 2, device=DEVICE) * 6.0
    slots = torch.randperm(NUM_BLOCKS * BLOCK, device=DEVICE)[:tokens]
    slots[1] = -1
    return q, k, v, positions, angles.cos(), angles.sin(), slots


def caches(kind: str, dtype: torch.dtype) -> tuple:
    """(k_cache, v_cache, k_scale, v_scale) of one kind, filled with values nobody wrote."""
    shape = (NUM_BLOCKS, BLOCK, KV_HEADS, DIM)
    if kind == "int8":
        k, v = (torch.randint(-127, 128, shape, dtype=torch.int8, device=DEVICE) for _ in "kv")
        storage, ((k_scales, v_scales),) = allocate_kv_scales(
            1, NUM_BLOCKS, BLOCK, KV_HEADS, DEVICE
        )
        storage.fill_(0.5)
        return k, v, k_scales, v_scales
    cache_dtype = FP8_DTYPE if kind.startswith("fp8") else dtype
    k, v = (torch.randn(shape, device=DEVICE).to(cache_dtype) for _ in "kv")
    if kind == "fp8-slots-inner":
        v = to_slots_inner(v)
    scales = (0.5, 3.0) if kind.startswith("fp8") else (1.0, 1.0)
    return k, v, *scales


@pytest.mark.parametrize("kind", ["model", "fp8", "fp8-slots-inner", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_launch_gives_the_bits_of_rotary_then_write(kind, dtype):
    q, k, v, positions, cos, sin, slots = step_inputs(7, dtype)
    fused_cache, apart_cache = caches(kind, dtype), None
    apart_cache = tuple(c.clone() if isinstance(c, torch.Tensor) else c for c in fused_cache)
    q_fused, k_fused = rotary_write_kv(q, k, v, positions, cos, sin, *fused_cache[:2], slots,
                                       *fused_cache[2:])  # fmt: skip
    q_apart, k_apart = rotary(q, k, positions, cos, sin)
    write_kv(k_apart, v, *apart_cache[:2], slots, *apart_cache[2:])
    assert torch.equal(q_fused, q_apart) and torch.equal(k_fused, k_apart)
    for fused, apart in zip(fused_cache, apart_cache, strict=True):
        if isinstance(fused, torch.Tensor):  # the caches, an int8 cache's scales too
            same = fused.view(torch.uint8) if fused.dtype == FP8_DTYPE else fused
            assert torch.equal(same, apart.view(torch.uint8) if apart.dtype == FP8_DTYPE else apart)
    # The write happened (the padding row's slot excepted): the comparison is not vacuous.
    written = fused_cache[0].reshape(-1, KV_HEADS, DIM)[slots[0]]
    assert not torch.equal(written, caches(kind, dtype)[0].reshape(-1, KV_HEADS, DIM)[slots[0]])


def test_the_queries_go_into_a_given_buffer():
    """q_out (mixed_graphs.py's static buffer): the same bits, no new tensor; a buffer of
    another shape or layout is refused."""
    q, k, v, positions, cos, sin, slots = step_inputs(5, torch.float32)
    cache = caches("fp8-slots-inner", torch.float32)
    args = (q, k, v, positions, cos, sin, *cache[:2], slots, *cache[2:])
    q_new, _ = rotary_write_kv(*args)
    into = torch.full_like(q_new, float("nan"))
    q_given, _ = rotary_write_kv(*args, q_out=into)
    assert q_given is into and torch.equal(into, q_new)
    with pytest.raises(ValueError, match="q_out must be contiguous"):
        rotary_write_kv(*args, q_out=torch.empty(5, DIM, Q_HEADS, device=DEVICE).transpose(1, 2))


def test_no_tokens_write_nothing():
    q, k, v, positions, cos, sin, slots = step_inputs(3, torch.float32)
    k_cache, v_cache, *_ = caches("model", torch.float32)
    before = k_cache.clone()
    q_out, k_out = rotary_write_kv(q[:0], k[:0], v[:0], positions[:0], cos, sin, k_cache, v_cache,
                                   slots[:0])  # fmt: skip
    assert q_out.shape == (0, Q_HEADS, DIM) and torch.equal(k_cache, before)


def test_the_backend_fuses_on_cuda_only_and_once_enabled(monkeypatch):
    """Elsewhere the model's rotary is torch's, whose bits the fused launch does not promise;
    on CUDA ENABLED decides (on as shipped)."""
    from bulkgen.model.attention import rotary_write

    cpu = torch.device("cpu")
    monkeypatch.setattr(rotary_write, "ENABLED", True)
    assert get_backend("triton", cpu).rotary_write_kv is None
    assert get_backend("torch", cpu).rotary_write_kv is None
    monkeypatch.undo()
    assert rotary_write.ENABLED  # as shipped


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bulkgen.model.attention.rotary_write import _rotary_write_kv_kernel as kernel

pointers = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", positions_ptr="*i64",
    cos_ptr="*fp32", sin_ptr="*fp32", q_out_ptr="*bf16", k_out_ptr="*bf16",
    k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv", slot_ptr="*i64",
    k_scales_ptr="*fp8e4nv", v_scales_ptr="*fp8e4nv", partners_ptr="*i32")
constexprs = dict(Q_HEADS=32, Q_HEADS_PAD=32, K_HEADS=8, K_HEADS_PAD=8, HALF=64, HALF_PAD=64,
    BLOCK_SIZE=64, QUANTIZE=True, KV_INT8=False, PAIRS=True, WRITE_V=True)
signature = {}
for name in kernel.arg_names:
    if name in pointers:
        signature[name] = pointers[name]
    elif name in constexprs:
        signature[name] = "constexpr"
    else:
        signature[name] = "fp32" if name.endswith("inv_scale") else "i32"
source = ASTSource(kernel, signature, constexprs=constexprs)
options = dict(num_warps=8, enable_fp_fusion=False)
ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
print(f"barriers={ptx.count('bar.sync')} casts={ptx.count('e4m3x2')} fmas={ptx.count('fma.rn')}")
"""


def test_it_compiles_for_sm_90():
    """The interpreter never meets the GPU compiler: the kernel compiles for Hopper (in a
    process without TRITON_INTERPRET), with its barrier between the rotated keys' stores and
    their loads, its e4m3 casts, and no fused multiply-adds (the rotary's roundings)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    barriers, casts, fmas = map(int, re.findall(r"=(\d+)", done.stdout.splitlines()[-1]))
    assert barriers >= 1 and casts > 0 and fmas == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_gpu_engine_generates_the_same_tokens_with_the_fused_launch(
    tiny_model_dir, monkeypatch, kv_cache_dtype
):
    """The same greedy tokens, CUDA graphs and all, with rotary_write.ENABLED on and off."""
    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams
    from bulkgen.model.attention import rotary_write

    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(device="cuda", kv_cache_dtype=kv_cache_dtype, num_blocks=64, max_num_seqs=8)
    outs = {}
    for enabled in (False, True):
        monkeypatch.setattr(rotary_write, "ENABLED", enabled)
        llm = LLM(str(tiny_model_dir), **kw)
        assert (llm.engine.runner.model.model.layers[0].self_attn.backend.rotary_write_kv
                is not None) == enabled  # fmt: skip
        greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        outs[enabled] = [o.token_ids for o in llm.generate(ids, greedy)]
        llm.close()
    assert outs[True] == outs[False]


def test_one_launch_writes_a_first_blocks_low_parts_as_the_write_does():
    """Paired first blocks (kv_pairs.py): block 0's tokens put their low parts in block 5."""
    q, k, v, positions, cos, sin, _ = step_inputs(4, torch.bfloat16)
    slots = torch.tensor([0, 1, 5, 6], device=DEVICE)  # blocks 0 (paired) and 1
    partners = torch.tensor([5, -1, -1, -1, -1, -1], dtype=torch.int32, device=DEVICE)
    fused = caches("fp8-slots-inner", torch.bfloat16)
    apart = tuple(c.clone() if isinstance(c, torch.Tensor) else c for c in fused)
    before = fused[0][5].clone()
    rotary_write_kv(q, k, v, positions, cos, sin, *fused[:2], slots, *fused[2:], partners=partners)
    k_apart = rotary(q, k, positions, cos, sin)[1]
    write_kv(k_apart, v, *apart[:2], slots, *apart[2:], partners=partners)
    for got, want in zip(fused[:2], apart[:2], strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(fused[0][5].view(torch.uint8), before.view(torch.uint8))
