"""A big decode step's fp8 values stored by the decode launch after its loop (decode_values.py):
the cache's bits of rotary_write's full write, an output within float32 rounding of rotary_write
then decode (the new position's score is summed in another order), split or not, padding rows,
a row whose only position is the new one; taken above decode_rotary.MAX_ROWS rows only. Under
the Triton interpreter without CUDA; compiled for sm_90; on the GPU at the 8B attention shape
and in the engine.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_decode_rotary import decode_step, needs_cuda, same  # noqa: E402
from test_triton_kernels import DEVICE, nan_buffers  # noqa: E402, F401

from bulkgen.model.attention import decode_rotary, decode_values  # noqa: E402
from bulkgen.model.attention.decode_values import DeferredValues  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE, FP8_MAX  # noqa: E402
from bulkgen.model.attention.rotary_write import rotary_write_kv  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402
from bulkgen.model.switches import DECODE_DEFER_V_ENV, DECODE_MMA_ENV  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def apart_and_deferred(step, k_cache, v_cache, tables, lens, scales, **kw):
    """(output, k_cache, v_cache) of rotary_write then decode, and of rotary_write's keys then
    the launch storing the values. The new tokens' value slots hold a stale 448 first: read
    before they are stored, they would move the output far."""
    rows = torch.arange(len(lens), device=DEVICE)[step.slot_mapping >= 0]
    slots = step.slot_mapping[rows]
    blocks, offsets = slots // v_cache.shape[1], slots % v_cache.shape[1]
    stale = v_cache.clone()
    stale[blocks, offsets] = torch.full(stale[blocks, offsets].shape, FP8_MAX).to(FP8_DTYPE)
    results = []
    for deferred in (False, True):
        k_c, v_c = k_cache.clone(), stale.clone()
        args = (step.q, step.k, step.v, step.positions, step.cos, step.sin, k_c, v_c)
        q = rotary_write_kv(*args, step.slot_mapping, write_v=not deferred, **scales)[0]
        rotate = {"rotate": DeferredValues(q, step.v, step.slot_mapping)} if deferred else {}
        out = paged_decode(q, k_c, v_c, lens, tables, q.shape[-1] ** -0.5, **scales, **rotate, **kw)
        results.append((out, k_c, v_c))
    return results


def close(out, ref, dtype) -> None:
    """Within a rounding of the output's dtype (float32: of its sums)."""
    if isinstance(out, tuple):  # FP8 rows and their scales: the rows dequantized
        out, ref = out[0].float() * out[1][:, None], ref[0].float() * ref[1][:, None]
        dtype = FP8_DTYPE
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, FP8_DTYPE: 0.13}
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol[dtype], atol=tol[dtype])


@pytest.mark.usefixtures("nan_buffers")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_the_launch_stores_the_values_rotary_write_would_and_attends_alike(dtype, splits):
    seq_lens = [1, 7, 0, 13, 20, 16, 5]  # a padding row; 16 ends a block; 1: only the new token
    inputs = decode_step(seq_lens, 4, 2, 4, 32, FP8_DTYPE, dtype, dtype != torch.float32)
    (out_a, k_a, v_a), (out_d, k_d, v_d) = apart_and_deferred(*inputs, num_splits=splits)
    assert same(k_d, k_a) and same(v_d, v_a)
    close(out_d, out_a, dtype)
    assert not same(v_d, inputs[2])  # not vacuous: the launch stored the new values


@pytest.mark.usefixtures("nan_buffers")
def test_fp8_rows_of_a_split_step_agree():
    """o_proj's FP8 rows from the merge (attend_fp8_rows) with the values deferred."""
    inputs = decode_step([5, 30, 0, 17], 4, 2, 4, 32, FP8_DTYPE, torch.bfloat16, True)
    (rows_a, *_), (rows_d, *_) = apart_and_deferred(*inputs, num_splits=2, fp8_rows=True)
    assert isinstance(rows_d, tuple)
    close(rows_d, rows_a, torch.bfloat16)


def test_it_takes_big_fp8_steps_only_unless_switched_off(monkeypatch):
    from test_kv_layout import slots_inner_copy

    rows = decode_rotary.MAX_ROWS + 1
    fp8 = slots_inner_copy(torch.zeros(2, 4, 2, 32).to(FP8_DTYPE))
    assert decode_values.defers_values(fp8, pairs=False, rows=rows)
    assert not decode_values.defers_values(fp8, pairs=False, rows=rows - 1)  # ROTATE's
    assert not decode_values.defers_values(fp8, pairs=True, rows=rows)
    rows_layout = torch.zeros(2, 4, 2, 32).to(FP8_DTYPE)  # whole sectors: nothing to gain
    assert not decode_values.defers_values(rows_layout, pairs=False, rows=rows)
    assert not decode_values.defers_values(torch.zeros(2, 4, 2, 32).bfloat16(), False, rows)
    int8 = slots_inner_copy(torch.zeros(2, 4, 2, 32, dtype=torch.int8))
    assert not decode_values.defers_values(int8, pairs=False, rows=rows)
    monkeypatch.setenv(DECODE_MMA_ENV, "1")
    assert not decode_values.defers_values(fp8, pairs=False, rows=rows)
    monkeypatch.setenv(DECODE_MMA_ENV, "0")
    monkeypatch.setenv(DECODE_DEFER_V_ENV, "0")
    assert not decode_values.defers_values(fp8, pairs=False, rows=rows)
    monkeypatch.setenv(DECODE_DEFER_V_ENV, "2")
    with pytest.raises(ValueError, match="must be 1 or 0"):
        decode_values.defers_values(fp8, pairs=False, rows=rows)


COMPILE = """
import triton
from triton.compiler import ASTSource
from compile_check_attention import TARGET, decode_source, decode_values_source

for prefetch in (True, False):
    for defer in (False, True):
        src = decode_values_source(prefetch) if defer else decode_source(
            "fp8", v_slots_inner=True, prefetch_blocks=prefetch)
        kernel = triton.compile(src, target=TARGET, options={"num_warps": 4, "num_stages": 3})
        ptx = kernel.asm["ptx"]
        print(int(prefetch), int(defer), ptx.count("st.global.b8"), ptx.count("ld.local"),
              kernel.n_regs if hasattr(kernel, "n_regs") else -1)
"""


def test_it_compiles_for_sm_90_storing_bytes_without_spills():
    """Compiled for Hopper (a process without TRITON_INTERPRET): the launch with DEFER_V stores
    the value's bytes (the launch without stores none) and spills nothing to local memory."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "scripts")])
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^(\d) (\d) (\d+) (\d+) (-?\d+)$", done.stdout, re.M)
    assert len(rows) == 4, done.stdout
    for _, defer, byte_stores, spills, _ in rows:
        assert (int(byte_stores) > 0) == (defer == "1") and int(spills) == 0, rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA: the GPU engine test below")
def test_the_engine_generates_the_same_tokens_with_the_values_in_the_decode_launch(
    tiny_model_dir, allow_fp8, monkeypatch
):
    """The tiny model through the Triton kernels (interpreter, float32, fp8 cache): with
    decode_rotary.MAX_ROWS at 0 every decode-only step defers its values (rotary_write's launch
    on the CPU too), steps with prefill never; the same greedy tokens with it on and off."""
    import dataclasses

    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams
    from bulkgen.engine import engine as engine_module
    from bulkgen.model.attention import get_backend

    taken = []

    def backend(*args):  # the CUDA backend's launches, on the CPU; counts the deferrals
        base = get_backend(*args)

        def attend(*a, rotate=None, **kw):
            taken.append(isinstance(rotate, DeferredValues))
            return base.attend(*a, rotate=rotate, **kw) if rotate else base.attend(*a, **kw)

        return dataclasses.replace(
            base, decode_rotary=True, attend=attend, attend_fp8_rows=None,
            rotary_write_kv=rotary_write_kv, fp8_v_slots_inner=True,
        )  # fmt: skip

    monkeypatch.setattr(engine_module, "get_backend", backend)
    monkeypatch.setattr(decode_rotary, "MAX_ROWS", 0)
    ids = encode_all(tiny_model_dir, PROMPTS[:4])
    kw = dict(dtype="float32", kv_cache_dtype="fp8", max_num_seqs=4, num_blocks=64)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = {}
    for on in ("1", "0"):
        monkeypatch.setenv(DECODE_DEFER_V_ENV, on)
        taken.clear()
        llm = LLM(str(tiny_model_dir), device="cpu", attention="triton", **kw)
        outs[on] = [o.token_ids for o in llm.generate(ids, params)]
        llm.close()
        assert any(taken) == (on == "1") and not all(taken)  # prefill steps never take it
    assert outs["1"] == outs["0"]
    assert len({tuple(t) for t in outs["1"]}) > 1  # not one degenerate answer for all


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("batch", [65, 256, 889])
@pytest.mark.usefixtures("nan_buffers")
def test_gpu_deferred_values_at_the_8b_shape(batch):
    """Compiled: Llama-3-8B's attention (8 kv heads of 4 queries, head_dim 128), 64-token
    blocks, values slots inner, contexts up to 2K, the engine's launch for the batch."""
    seq_lens = torch.randint(1, 2048, (batch,)).tolist()
    seq_lens[batch // 2] = 0  # a padding row
    inputs = decode_step(seq_lens, 64, 8, 4, 128, FP8_DTYPE, torch.bfloat16, True)
    (out_a, k_a, v_a), (out_d, k_d, v_d) = apart_and_deferred(*inputs)
    assert same(k_d, k_a) and same(v_d, v_a)
    close(out_d, out_a, torch.bfloat16)


@needs_cuda
@pytest.mark.gpu
def test_gpu_engine_generates_the_same_tokens_with_the_values_in_the_decode_launch(
    tiny_model_dir, monkeypatch
):
    """bf16, fp8 cache, CUDA graphs and all, every decode step deferring (MAX_ROWS 0): the same
    greedy tokens with BULKGEN_DECODE_DEFER_V on and off."""
    from test_engine import PROMPTS, encode_all

    from bulkgen import LLM, SamplingParams

    monkeypatch.setattr(decode_rotary, "MAX_ROWS", 0)
    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(device="cuda", kv_cache_dtype="fp8", num_blocks=64, max_num_seqs=8)
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for on in ("1", "0"):
        monkeypatch.setenv(DECODE_DEFER_V_ENV, on)
        llm = LLM(str(tiny_model_dir), **kw)
        outs[on] = [o.token_ids for o in llm.generate(ids, greedy)]
        llm.close()
    assert outs["1"] == outs["0"]
