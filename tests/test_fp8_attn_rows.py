"""The split decode's merge writing o_proj's input as FP8 rows (decode_merge.merge_splits_to_fp8,
on unless BULKGEN_FP8_ATTN_ROWS=0) gives the rows and scales that merge_splits then
quantize_rows give, and the model hands them to o_proj only where it quantizes its input per row
itself.

Without CUDA the kernels run under the Triton interpreter (TRITON_INTERPRET is set before triton
is imported, hence the import order).
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_fp8 import needs_fp8_gpu  # noqa: E402
from test_kv_fp8_kernels import K_SCALE, V_SCALE, fp8_paged_kv  # noqa: E402
from test_triton_kernels import DEVICE, metadata, paged_kv  # noqa: E402

from bulkgen.model.attention.decode_merge import merge_splits, merge_splits_to_fp8  # noqa: E402
from bulkgen.model.attention.triton_backend import attend_fp8_rows  # noqa: E402
from bulkgen.model.attention.triton_decode import paged_decode  # noqa: E402
from bulkgen.model.fp8 import Fp8Activation, fuse_input_quantization  # noqa: E402
from bulkgen.model.fp8_kernels import quantize_rows  # noqa: E402
from bulkgen.model.switches import ATTN_ROWS_ENV  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def same_rows(a: Fp8Activation, b: Fp8Activation) -> bool:
    return torch.equal(a.q.view(torch.uint8), b.q.view(torch.uint8)) and torch.equal(
        a.scale, b.scale
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("splits, heads", [(2, 32), (4, 8), (3, 6)])
def test_the_merged_rows_are_the_merge_then_the_quantizer_bit_for_bit(dtype, splits, heads):
    batch, head_dim = 5, 64
    part_out = torch.randn(batch, heads, splits, head_dim, device=DEVICE) * 3
    part_lse = torch.randn(batch, heads, splits, device=DEVICE) * 4
    part_lse[1, :, 1:] = float("-inf")  # a short sequence: its later splits empty
    part_lse[3] = float("-inf")  # a padding row: every split empty, out 0
    out = torch.empty(batch, heads, head_dim, dtype=dtype, device=DEVICE)
    merge_splits(part_out, part_lse, out)
    ref = Fp8Activation(*quantize_rows(out.reshape(batch, -1)))
    assert same_rows(Fp8Activation(*merge_splits_to_fp8(part_out, part_lse, dtype)), ref)


@pytest.mark.parametrize("num_splits", [1, 2, 4])
def test_a_split_decode_returns_fp8_rows_and_an_unsplit_one_its_output(num_splits):
    seq_lens, kv_heads, group, head_dim = [37, 5, 130], 2, 4, 64
    k_cache, v_cache, block_tables = fp8_paged_kv(seq_lens, 16, kv_heads, head_dim)
    q = torch.randn(len(seq_lens), kv_heads * group, head_dim, device=DEVICE).to(torch.bfloat16)
    args = (q, k_cache, v_cache, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE))
    args += (block_tables, head_dim**-0.5, num_splits)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    out = paged_decode(*args, **scales)
    rows = paged_decode(*args, **scales, fp8_rows=True)
    if num_splits == 1:
        assert torch.equal(rows, out)
    else:
        assert same_rows(rows, Fp8Activation(*quantize_rows(out.reshape(len(seq_lens), -1))))


def test_a_step_with_prefill_attends_as_always():
    seq_lens, query_lens = [20, 9], [4, 9]
    k, v, block_tables = paged_kv(seq_lens, 16, 2, 64, torch.bfloat16)
    q = torch.randn(sum(query_lens), 8, 64, dtype=torch.bfloat16, device=DEVICE)
    meta = metadata(seq_lens, query_lens, block_tables)
    from bulkgen.model.attention.triton_backend import paged_attention

    assert torch.equal(attend_fp8_rows(q, k, v, meta, 0.125), paged_attention(q, k, v, meta, 0.125))


@pytest.mark.parametrize("on", ["0", "1", None])  # None: unset, the default (on)
def test_the_model_hands_o_proj_fp8_rows_only_when_switched_on(tiny_model_dir, monkeypatch, on):
    """The tiny FP8 model (torch attention on the CPU) with a backend whose attend_fp8_rows
    returns the output's rows quantized: the same logits, and o_proj given FP8 rows when on."""
    from fp8_checkpoints import load, logits

    model = load(tiny_model_dir, quantization="fp8")
    fuse_input_quantization(model)
    ids = list(range(5, 30))
    before = logits(model, ids)
    handed, base = [], model.model.layers[0].self_attn.backend

    def rows(q, *args):
        o = base.attend(q, *args)
        handed.append(1)
        return Fp8Activation(*quantize_rows(o.reshape(o.shape[0], -1)))

    for layer in model.model.layers:
        layer.self_attn.backend = dataclasses.replace(base, attend_fp8_rows=rows)
    if on is None:
        monkeypatch.delenv(ATTN_ROWS_ENV, raising=False)
    else:
        monkeypatch.setenv(ATTN_ROWS_ENV, on)
    assert torch.equal(logits(model, ids), before)
    assert len(handed) == (len(model.model.layers) if on != "0" else 0)


@needs_fp8_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 32])
def test_gpu_merged_rows_match_the_merge_then_the_quantizer_at_the_8b_shape(batch):
    """32 query heads of 128 at the splits blog's decode takes; float32 sums over the splits
    in another order may move a value across an e4m3 rounding boundary: within one e4m3 step."""
    part_out = torch.randn(batch, 32, 2, 128, device="cuda")
    part_lse = torch.randn(batch, 32, 2, device="cuda") * 4
    out = torch.empty(batch, 32, 128, dtype=torch.bfloat16, device="cuda")
    merge_splits(part_out, part_lse, out)
    ref_q, ref_scale = quantize_rows(out.reshape(batch, -1))
    q, scale = merge_splits_to_fp8(part_out, part_lse, torch.bfloat16)
    assert torch.equal(scale, ref_scale)
    assert ((q.float() - ref_q.float()).abs() <= ref_q.float().abs() / 8 + 2**-9).all()


COMPILE = """
import re, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bulkgen.model.attention.decode_merge import _decode_reduce_rows_kernel as kernel
signature = {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "q_ptr": "*fp8e4nv"}
signature["scale_ptr"] = "*fp32"
constexprs = {"NUM_SPLITS": 2, "SPLITS_PAD": 2, "HEAD_DIM": 128, "HEADS": 32, "HEADS_PAD": 32}
constexprs |= {"DTYPE": tl.bfloat16, "HW_ROUND": True}
signature |= {name: "constexpr" for name in constexprs}
source = ASTSource(kernel, signature, constexprs=constexprs)
ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
casts, local = len(re.findall(r"cvt[^;]*e4m3", ptx)), len(re.findall(r"ld.local", ptx))
print(casts, "e4m3 casts,", local, "local")
"""


def test_the_rows_merge_compiles_for_sm_90_with_its_e4m3_casts_and_no_spills():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    casts, local = done.stdout.split(" e4m3 casts, ")
    assert int(casts) > 0 and local.strip() == "0 local", done.stdout
