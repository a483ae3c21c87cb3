"""Values stored RUN tokens a program (triton_kv_runs.py) land where write_kv puts them, with its
bits, whatever the slots: runs within a block, runs crossing a block boundary, sequences meeting
inside a program, scattered decoding rows and graph padding rows (-1). And rotary_write_kv with
v_runs (a step with prefill) leaves the caches as without. Under the Triton interpreter without
CUDA (TRITON_INTERPRET set before any kernel is defined).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_triton_kernels import DEVICE  # noqa: E402

from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.kv_layout import to_slots_inner  # noqa: E402
from bulkgen.model.attention.rotary_write import rotary_write_kv  # noqa: E402
from bulkgen.model.attention.triton_kv_runs import RUN, runs_apply, write_v_runs  # noqa: E402
from bulkgen.model.attention.triton_kv_write import write_kv  # noqa: E402

KV_HEADS, DIM, BLOCK, NUM_BLOCKS = 3, 32, 64, 8  # 3 heads: a padded head row in every tile


def step_slots() -> torch.Tensor:
    """A mixed step's slots: 5 decoding rows (scattered), a padding row, a 70-token prompt from
    block 2's slot 10 (runs, then a block boundary at its 54th token), a 20-token prompt from
    block 5's slot 0 and 9 tokens from block 6's slot 60 (a boundary at its fifth)."""
    decoding = torch.tensor([7 * BLOCK + 3, 0 * BLOCK + 40, 1 * BLOCK + 63, 4 * BLOCK + 1, 9])
    prompt = torch.arange(2 * BLOCK + 10, 2 * BLOCK + 10 + 70)
    prompt[54:] = torch.arange(4 * BLOCK + 20, 4 * BLOCK + 36)  # its next block is elsewhere
    second = torch.arange(5 * BLOCK, 5 * BLOCK + 20)
    third = torch.cat(
        [torch.arange(6 * BLOCK + 60, 6 * BLOCK + 64), torch.arange(3 * BLOCK, 3 * BLOCK + 5)]
    )
    return torch.cat([decoding, torch.tensor([-1]), prompt, second, third]).to(DEVICE)


def cache() -> torch.Tensor:
    v = torch.randn(NUM_BLOCKS, BLOCK, KV_HEADS, DIM, device=DEVICE).to(FP8_DTYPE)
    return to_slots_inner(v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_in_runs_land_as_the_per_token_write_puts_them(dtype):
    torch.manual_seed(0)
    slots = step_slots()
    tokens = slots.shape[0]
    assert tokens % RUN != 0  # a last program past the end
    k = torch.randn(tokens, KV_HEADS, DIM, device=DEVICE).to(dtype)
    v = (torch.randn(tokens, KV_HEADS, DIM, device=DEVICE) * 300).to(dtype)  # some saturate
    runs, apart = cache(), cache()
    apart.copy_(runs)
    k_cache = torch.zeros(runs.shape, device=DEVICE).to(FP8_DTYPE)  # rows: keys' own layout
    assert runs_apply(runs, None) and not runs_apply(runs, torch.zeros(1)) and not runs_apply(
        torch.zeros(2, BLOCK, 1, DIM, device=DEVICE), None
    )  # fmt: skip
    write_v_runs(v, runs, slots, 2.0)
    write_kv(k, v, k_cache, apart, slots, 1.0, 2.0)
    assert torch.equal(runs.view(torch.uint8), apart.view(torch.uint8))


def test_rotary_write_with_v_runs_leaves_the_caches_as_without():
    torch.manual_seed(1)
    slots = step_slots()
    tokens, q_heads = slots.shape[0], 2 * KV_HEADS
    qkv = torch.randn(tokens, (q_heads + 2 * KV_HEADS) * DIM, device=DEVICE)
    q, k, v = (
        x.view(tokens, -1, DIM) for x in qkv.split([q_heads * DIM] + [KV_HEADS * DIM] * 2, -1)
    )
    positions = torch.randint(0, 64, (tokens,), device=DEVICE)
    angles = torch.rand(64, DIM // 2, device=DEVICE) * 6.0
    outs = []
    for v_runs in (False, True):
        k_cache = torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, DIM, device=DEVICE).to(FP8_DTYPE)
        v_cache = to_slots_inner(torch.zeros_like(k_cache))
        rotated = rotary_write_kv(q, k, v, positions, angles.cos(), angles.sin(), k_cache, v_cache,
                                  slots, 0.5, 3.0, v_runs=v_runs)  # fmt: skip
        outs.append((*rotated, k_cache.view(torch.uint8), v_cache.view(torch.uint8)))
    for without, with_runs in zip(*outs, strict=True):
        assert torch.equal(without, with_runs)


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bulkgen.model.attention.triton_kv_runs import _write_v_runs_kernel as kernel

signature = dict(v_ptr="*bf16", v_cache_ptr="*fp8e4nv", slot_ptr="*i64", v_inv_scale="fp32")
constexprs = dict(BLOCK_SIZE=64, HEADS=8, HEAD_DIM=128, RUN=16)
default = {n: "constexpr" if n in constexprs else "i32" for n in kernel.arg_names}
signature = {n: signature.get(n, kind) for n, kind in default.items()}
source = ASTSource(kernel, signature, constexprs=constexprs)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
print(compiled.asm["ttgir"])
"""


def test_it_compiles_for_sm_90_with_a_runs_bytes_along_lanes():
    """Compiled for Hopper (in a process without TRITON_INTERPRET), a run's store lays each
    dim's RUN bytes along a warp's lanes (the layout's fastest dimension is the run's), where
    the per-token store's lanes run along head_dim, 64 bytes apart."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    layouts = dict(re.findall(r"^(#blocked\d*) = #ttg\.blocked<\{(.*)\}>", done.stdout, re.M))
    stored = set(re.findall(r"tt\.store .*, (#blocked\d*)>", done.stdout))
    orders = {re.search(r"order = \[(\d+)", layouts[name]).group(1) for name in stored}
    assert orders == {"0", "1"}  # the run's store (run dimension first) and the per-token one
