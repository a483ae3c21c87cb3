"""A decode step's rotary and KV write inside the decode launch (decode_rotary.py): the same
output and the same cache bits as rotary_write.py's launch followed by the decode launch, for
every cache it takes, split or not; the model takes it in decode-only steps only, with logits
unchanged. Under the Triton interpreter without CUDA; compiled for sm_90; on the GPU at the 8B
attention shape and in the engine.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_layout import caches, slots_inner_copy  # noqa: E402
from test_triton_kernels import DEVICE, nan_buffers  # noqa: E402, F401

from bulkgen.model.attention import decode_rotary  # noqa: E402
from bulkgen.model.attention.decode_rotary import Unrotated  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.rotary_write import rotary_write_kv  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402
from bulkgen.model.switches import DECODE_ROTARY_ENV  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def decode_step(seq_lens, block_size, kv_heads, group, dim, cache_dtype, dtype, v_inner):
    """A decode step over caches whose old tokens are random: (Unrotated, k_cache, v_cache,
    block tables, seq_lens, scales). Row b's new token sits at position seq_lens[b] - 1; a row
    of seq_len 0 is a CUDA-graph padding row (slot -1)."""
    k_cache, v_cache, tables, scales = caches(seq_lens, block_size, kv_heads, dim, cache_dtype)
    v_cache = slots_inner_copy(v_cache) if v_inner else v_cache
    rows, heads = len(seq_lens), kv_heads * group
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, device=DEVICE).to(dtype)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = (x.view(rows, -1, dim) for x in (q, k, v))  # strided views, as the model's
    lens = torch.tensor(seq_lens, device=DEVICE)
    positions = (lens - 1).clamp(min=0)
    blocks = tables[torch.arange(rows, device=DEVICE), positions // block_size].long()
    slots = torch.where(lens > 0, blocks * block_size + positions % block_size, -1)
    angles = torch.rand(max(seq_lens) + 5, dim // 2, device=DEVICE) * 6.0
    step = Unrotated(q, k, v, positions, angles.cos(), angles.sin(), slots)
    return step, k_cache, v_cache, tables, lens.int(), scales


def apart_and_fused(step, k_cache, v_cache, tables, lens, scales, **kw):
    """(output, k_cache, v_cache) of rotary_write then decode, and of the one launch."""
    results = []
    for fused in (False, True):
        k_c, v_c = k_cache.clone(), v_cache.clone()
        if fused:
            q = step.q
            rotate = {"rotate": step}
        else:
            args = (step.q, step.k, step.v, step.positions, step.cos, step.sin, k_c, v_c)
            q = rotary_write_kv(*args, step.slot_mapping, **scales)[0]
            rotate = {}
        out = paged_decode(q, k_c, v_c, lens, tables, q.shape[-1] ** -0.5, **scales, **rotate, **kw)
        results.append((out, k_c, v_c))
    return results


def same(a, b) -> bool:
    """Bit equality (fp8 tensors compared as bytes; a tuple of FP8 rows and scales pairwise)."""
    if isinstance(a, tuple):
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    if a.dtype == FP8_DTYPE:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


CACHES = [
    (FP8_DTYPE, torch.bfloat16, True),
    (FP8_DTYPE, torch.float16, True),
    (FP8_DTYPE, torch.float32, False),
    (torch.float16, torch.float16, False),
    (torch.bfloat16, torch.bfloat16, False),
    (torch.float32, torch.float32, False),
]


@pytest.mark.usefixtures("nan_buffers")
@pytest.mark.parametrize("cache_dtype, dtype, v_inner", CACHES)
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_one_launch_gives_the_bits_of_rotary_write_then_decode(cache_dtype, dtype, v_inner, splits):
    seq_lens = [1, 7, 0, 13, 20, 16]  # a padding row; 16 ends a block exactly
    inputs = decode_step(seq_lens, 4, 2, 4, 32, cache_dtype, dtype, v_inner)
    (out_a, k_a, v_a), (out_f, k_f, v_f) = apart_and_fused(*inputs, num_splits=splits)
    assert same(out_f, out_a) and same(k_f, k_a) and same(v_f, v_a)
    # Not vacuous: the step wrote the new tokens (the fused launch's cache differs from before).
    assert not same(k_f, inputs[1])


@pytest.mark.usefixtures("nan_buffers")
def test_fp8_rows_of_a_split_step_are_the_same():
    """o_proj's FP8 rows from the merge (attend_fp8_rows) after the one launch."""
    inputs = decode_step([5, 30, 0, 17], 4, 2, 4, 32, FP8_DTYPE, torch.bfloat16, True)
    (rows_a, *_), (rows_f, *_) = apart_and_fused(*inputs, num_splits=2, fp8_rows=True)
    assert isinstance(rows_f, tuple) and same(rows_f, rows_a)


def test_it_takes_few_rows_unless_switched_off_and_never_int8_or_pairs(monkeypatch):
    cache, rows = torch.empty(1, 4, 2, 32, dtype=FP8_DTYPE), decode_rotary.MAX_ROWS
    assert decode_rotary.defers(cache, pairs=False, rows=rows)
    assert not decode_rotary.defers(cache, pairs=False, rows=rows + 1)
    assert not decode_rotary.defers(cache, pairs=True, rows=1)
    assert not decode_rotary.defers(torch.empty(1, 4, 2, 32, dtype=torch.int8), False, 1)
    monkeypatch.setenv(DECODE_ROTARY_ENV, "0")
    assert not decode_rotary.defers(cache, pairs=False, rows=1)
    monkeypatch.setenv(DECODE_ROTARY_ENV, "2")
    with pytest.raises(ValueError, match="must be 1 or 0"):
        decode_rotary.defers(cache, pairs=False, rows=1)


COMPILE = """
import triton
from triton.compiler import ASTSource
from compile_check_attention import TARGET, decode_rotary_source

for cache, q in (("fp8", "bf16"), ("fp8", "fp16"), ("bf16", "bf16")):
    src = decode_rotary_source(cache)
    names = list(src.signature)
    signature = dict(src.signature)
    for name in ("q_ptr", "out_ptr", "k_new_ptr", "v_new_ptr"):
        signature[name] = "*" + q
    constexprs = {names[k[0]] if isinstance(k, tuple) else k: v for k, v in src.constants.items()}
    source = ASTSource(src.fn, signature, constexprs=constexprs, attrs=src.attrs)
    ptx = triton.compile(source, target=TARGET, options={"num_warps": 4}).asm["ptx"]
    cvt = "cvt.rn.f16.f32" if q == "fp16" else "cvt.rn.bf16.f32"
    print(cache, q, ptx.count(cvt), ptx.count("bar.sync"), ptx.count("ld.local"))
"""


def test_it_compiles_for_sm_90_with_its_roundings_in_ptx():
    """Compiled for Hopper (a process without TRITON_INTERPRET; the engine's fp8 launch and a
    16-bit one): every rotary rounding a cvt to the query's dtype (bf16 or fp16; round_to's
    PTX, so that no cast pair is folded), a barrier, nothing spilled to local memory."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "scripts")])
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^(\w+) (\w+) (\d+) (\d+) (\d+)$", done.stdout, re.M)
    assert len(rows) == 3, done.stdout
    for _, _, casts, barriers, spills in rows:
        # q's 16 padded rows x 128 and k's 128 values, 3 roundings each, over 128 threads
        assert int(casts) >= 48 and int(barriers) >= 1 and int(spills) == 0, rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA: the GPU engine test below")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_the_engine_generates_the_same_tokens_with_the_rotary_in_the_decode_launch(
    tiny_model_dir, allow_fp8, monkeypatch, kv_cache_dtype
):
    """The tiny model through the Triton kernels (interpreter, float32, where torch's rotary and
    fused_rotary's agree bit for bit): decode-only steps take the one launch, steps with
    prefill the rotary apart; the same greedy tokens with it on and off."""
    import dataclasses

    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams
    from bulkgen.engine import engine as engine_module
    from bulkgen.model.attention import get_backend

    taken = []

    def backend(*args):  # the CUDA backend's decode_rotary, on the CPU; counts the launches
        base = get_backend(*args)

        def attend(*a, rotate=None, **kw):
            taken.append(rotate is not None)
            return base.attend(*a, rotate=rotate, **kw) if rotate else base.attend(*a, **kw)

        return dataclasses.replace(base, decode_rotary=True, attend=attend, attend_fp8_rows=None)

    monkeypatch.setattr(engine_module, "get_backend", backend)
    ids = encode_all(tiny_model_dir, PROMPTS[:4])
    kw = dict(dtype="float32", kv_cache_dtype=kv_cache_dtype, max_num_seqs=4, num_blocks=64)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = {}
    for on in ("1", "0"):
        monkeypatch.setenv(DECODE_ROTARY_ENV, on)
        taken.clear()
        llm = LLM(str(tiny_model_dir), device="cpu", attention="triton", **kw)
        outs[on] = [o.token_ids for o in llm.generate(ids, params)]
        llm.close()
        assert any(taken) == (on == "1") and not all(taken)  # prefill steps never take it
    assert outs["1"] == outs["0"]
    assert len({tuple(t) for t in outs["1"]}) > 1  # not one degenerate answer for all


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", [FP8_DTYPE, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 32, 256])
@pytest.mark.usefixtures("nan_buffers")
def test_gpu_one_launch_gives_the_bits_of_rotary_write_then_decode_at_the_8b_shape(
    cache_dtype, batch
):
    """Compiled, with round_to's PTX and the barrier: Llama-3-8B's attention (8 kv heads of 4
    queries, head_dim 128), 64-token blocks, contexts up to 2K, the launch's own split count."""
    seq_lens = torch.randint(1, 2048, (batch,)).tolist()
    seq_lens[batch // 2] = 0  # a padding row
    v_inner = cache_dtype == FP8_DTYPE
    inputs = decode_step(seq_lens, 64, 8, 4, 128, cache_dtype, torch.bfloat16, v_inner)
    (out_a, k_a, v_a), (out_f, k_f, v_f) = apart_and_fused(*inputs)
    assert same(out_f, out_a) and same(k_f, k_a) and same(v_f, v_a)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_gpu_engine_generates_the_same_tokens_with_the_rotary_in_the_decode_launch(
    tiny_model_dir, monkeypatch, kv_cache_dtype
):
    """bf16, CUDA graphs and all: the same greedy tokens with BULKGEN_DECODE_ROTARY on and off."""
    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams

    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(device="cuda", kv_cache_dtype=kv_cache_dtype, num_blocks=64, max_num_seqs=8)
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for on in ("1", "0"):
        monkeypatch.setenv(DECODE_ROTARY_ENV, on)
        llm = LLM(str(tiny_model_dir), **kw)
        outs[on] = [o.token_ids for o in llm.generate(ids, greedy)]
        llm.close()
    assert outs["1"] == outs["0"]
