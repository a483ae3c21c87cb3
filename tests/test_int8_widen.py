"""triton_kv.int8_to_f16: an int8 tile widened to float16 is every value exactly, in its place,
by the cast (the interpreter, and the GPU) and by the PTX the attention kernels use on a GPU
(four values a register: a value in the wrong lane or byte shows). int8_asm says which runs.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bulkgen.model.attention.triton_kv import int8_asm, int8_to_f16  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@triton.jit
def _widen_kernel(x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, ASM: tl.constexpr):
    at = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    tl.store(out_ptr + at, int8_to_f16(tl.load(x_ptr + at), ASM))


@pytest.mark.parametrize("asm", [False, pytest.param(True, marks=[pytest.mark.gpu, needs_cuda])])
@pytest.mark.parametrize("rows, cols", [(128, 128), (16, 64), (64, 32)])
def test_every_int8_value_widens_exactly_in_its_place(asm, rows, cols):
    torch.manual_seed(0)
    every = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)
    x = every.repeat(-(-rows * cols // 256))[: rows * cols]
    x = x[torch.randperm(x.numel())].reshape(rows, cols).to(DEVICE)
    out = torch.empty(rows, cols, dtype=torch.float16, device=DEVICE)
    _widen_kernel[(1,)](x, out, ROWS=rows, COLS=cols, ASM=asm)
    assert torch.equal(out, x.to(torch.float16))


def test_the_ptx_runs_on_cuda_only_and_can_be_switched_off(monkeypatch):
    monkeypatch.delenv("BULKGEN_INT8_F16_ASM", raising=False)
    assert not int8_asm(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert int8_asm(torch.device("cuda"))
    monkeypatch.setenv("BULKGEN_INT8_F16_ASM", "0")  # an A/B run's cast
    assert not int8_asm(torch.device("cuda"))
    monkeypatch.setenv("BULKGEN_INT8_F16_ASM", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter has no inline PTX
    assert not int8_asm(torch.device("cuda"))
