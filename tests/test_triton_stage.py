"""triton_stage.py: one kernel stages a decode step's inputs into the decode graphs' static buffers
exactly as the torch ops did (the last-token gather, the graphs' former fill: copies and padding,
the block tables' gather). Without CUDA the kernel runs under the Triton interpreter (set before
triton is imported)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from invariant_steps import fill_graph_buffers  # noqa: E402

from bulkgen.engine.triton_stage import stage_decode_inputs, warm_up_staging  # noqa: E402
from bulkgen.model.attention.metadata import AttnMetadata, DecodeGraphBuffers  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def step(b: int, table_rows: int, gen: torch.Generator) -> SimpleNamespace:
    """A decode step's packed int64 inputs: some rows take the previous step's token."""
    rows = torch.randperm(table_rows, generator=gen)[:b]
    from_prev = torch.rand(b, generator=gen) < 0.6
    seq_lens = torch.randint(1, 4000, (b,), generator=gen)
    fields = dict(
        input_ids=torch.where(from_prev, 0, torch.randint(5, 1000, (b,), generator=gen)),
        prev_row=torch.where(from_prev, rows, -1),
        positions=seq_lens - 1,
        slot_mapping=torch.randint(0, 10**6, (b,), generator=gen),
        seq_lens=seq_lens,
        rows=rows,
    )
    return SimpleNamespace(**{k: v.to(torch.int64).to(DEVICE) for k, v in fields.items()})


def torch_staging(inp, last_token, block_table, ids, positions, meta, bucket):
    """What the runner did before the kernel: tables.input_ids, metadata, then the graphs' fill
    (now fill_graph_buffers, the tests' reference)."""
    prev = last_token[inp.prev_row.clamp(min=0)]
    b = inp.positions.shape[0]
    ids[:b].copy_(torch.where(inp.prev_row >= 0, prev, inp.input_ids))
    positions[:b].copy_(inp.positions)
    step_meta = AttnMetadata(
        slot_mapping=inp.slot_mapping,
        query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=DEVICE),
        seq_lens=inp.seq_lens.int(),
        block_tables=block_table.index_select(0, inp.rows),
        max_query_len=1,
        max_seq_len=int(inp.seq_lens.max()),
        decode_only=True,
    )
    fill_graph_buffers(meta, step_meta, bucket)


CASES = [(5, 8, 5), (13, 16, 300), (32, 32, 64), (1, 4, 257)]  # rows, bucket, table width


@pytest.mark.parametrize("b,bucket,width", CASES)
def test_the_kernel_stages_what_the_torch_ops_did(b, bucket, width):
    gen = torch.Generator().manual_seed(b * 1000 + width)
    table_rows, cap = 40, 48
    inp = step(b, table_rows, gen)
    last_token = torch.randint(0, 128000, (table_rows,), generator=gen).to(DEVICE)
    block_table = torch.randint(0, 5000, (table_rows, width), generator=gen, dtype=torch.int32)
    block_table = block_table.to(DEVICE)
    staged = []
    for fill in (torch_staging, stage_decode_inputs):
        # Stale contents from an earlier, larger step: padding rows must not depend on them,
        # except their block tables, which padding rows read but neither path rewrites.
        ids = torch.full((cap,), 7, dtype=torch.int64, device=DEVICE)
        positions = torch.full((cap,), 9, dtype=torch.int64, device=DEVICE)
        meta = DecodeGraphBuffers(cap, width, DEVICE)
        meta.slot_mapping.fill_(123)
        meta.seq_lens.fill_(77)
        meta.block_tables.copy_(torch.arange(cap * width, dtype=torch.int32).view(cap, width))
        fill(inp, last_token, block_table, ids, positions, meta, bucket)
        staged.append((ids, positions, meta))
    (ids0, pos0, meta0), (ids1, pos1, meta1) = staged
    assert torch.equal(ids0[:b], ids1[:b]) and torch.equal(pos0[:b], pos1[:b])
    assert torch.equal(meta0.slot_mapping, meta1.slot_mapping), "slot -1 on padding rows only"
    assert torch.equal(meta0.seq_lens, meta1.seq_lens) and meta1.seq_lens.dtype == torch.int32
    assert torch.equal(meta0.block_tables, meta1.block_tables)
    assert (meta1.slot_mapping[b:bucket] == -1).all() and (meta1.seq_lens[b:bucket] == 1).all()
    assert (meta1.slot_mapping[bucket:] == 123).all(), "rows past the bucket are left alone"
    from_prev = inp.prev_row >= 0
    assert torch.equal(ids1[:b][from_prev], last_token[inp.prev_row[from_prev]])
    assert torch.equal(ids1[:b][~from_prev], inp.input_ids[~from_prev])


def test_the_warm_up_stages_a_one_row_step_of_table_row_0():
    last_token = torch.tensor([42, 43], dtype=torch.int64, device=DEVICE)
    block_table = torch.arange(2 * 300, dtype=torch.int32, device=DEVICE).view(2, 300)
    ids = torch.full((4,), 7, dtype=torch.int64, device=DEVICE)
    positions = torch.full((4,), 9, dtype=torch.int64, device=DEVICE)
    meta = DecodeGraphBuffers(4, 300, DEVICE)
    warm_up_staging(last_token, block_table, ids, positions, meta)
    assert ids.tolist() == [0, 7, 7, 7] and positions.tolist() == [0, 9, 9, 9]
    assert meta.slot_mapping[0] == -1 and meta.seq_lens[0] == 1, "writes no KV"
    assert torch.equal(meta.block_tables[0], block_table[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_kernel_stages_what_the_torch_ops_did_on_cuda():
    for case in CASES:
        test_the_kernel_stages_what_the_torch_ops_did(*case)


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bulkgen.engine import triton_stage as s
ptrs = ["ids_ptr", "prev_ptr", "pos_ptr", "slot_ptr", "seq_ptr", "rows_ptr", "last_ptr"]
sig = {p: "*i64" for p in ptrs} | {"table_ptr": "*i32", "table_stride": "i32"}
sig |= {p: "*i64" for p in ("out_ids_ptr", "out_pos_ptr", "out_slot_ptr")}
sig |= {"out_seq_ptr": "*i32", "out_table_ptr": "*i32", "out_table_stride": "i32"}
sig |= {"b": "i32", "W": "i32", "BLOCK_W": "constexpr"}
src = ASTSource(s._stage_decode_kernel, sig, constexprs={"BLOCK_W": s.BLOCK_W})
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]
print(len(ptx))
"""


def test_the_kernel_compiles_for_hopper():
    """The interpreter skips the GPU compiler, which rejects more: compile for sm_90 in a process
    without TRITON_INTERPRET (no GPU needed)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 1000, "a PTX module"
