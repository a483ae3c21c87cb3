"""A decode step's inputs staged into the decode graphs' static buffers in one launch.

Before a replay the graph's inputs must sit in its static tensors: each row's input token (the
host's, or the previous step's sample from the last-token table), position, KV slot and context
length, and its block table row; rows past the step's own up to the bucket are padding (slot -1:
no KV written; context 1). Done with torch ops that was 13 kernels a step (the token gather's
clamp, index, compare and select, the context lengths' int32 cast, the block tables' gather, then
seven copies and fills), each a few microseconds of the GPU's time between replays and a launch
of the host's. Here one program per bucket row reads the packed int64 inputs and writes the static
buffers directly. The block table rows are copied whole (their width is the engine's), so the
kernel's launch never changes with the longest context; b is not specialised on (no compile per
step size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.engine.inputs import StepInputs
from bulkgen.model.attention.metadata import DecodeGraphBuffers

BLOCK_W = 256  # block-table entries copied per pass


@triton.jit(do_not_specialize=["b"])
def _stage_decode_kernel(
    ids_ptr,  # [b] int64: the host's token (0 where it comes from the previous step)
    prev_ptr,  # [b] int64: last-token table row holding the input token, or -1
    pos_ptr,  # [b] int64
    slot_ptr,  # [b] int64
    seq_ptr,  # [b] int64 context lengths, this step's token included
    rows_ptr,  # [b] int64 block-table rows
    last_ptr,  # [R] int64 last sampled token per table row
    table_ptr,  # [R, W] int32
    table_stride,
    out_ids_ptr,  # [bucket] int64
    out_pos_ptr,  # [bucket] int64
    out_slot_ptr,  # [bucket] int64
    out_seq_ptr,  # [bucket] int32
    out_table_ptr,  # [bucket, W] int32
    out_table_stride,
    b,
    W,
    BLOCK_W: tl.constexpr,
):
    r = tl.program_id(0)
    if r < b:
        prev = tl.load(prev_ptr + r)
        host = tl.load(ids_ptr + r)
        sampled = tl.load(last_ptr + tl.maximum(prev, 0))
        tl.store(out_ids_ptr + r, tl.where(prev >= 0, sampled, host))
        tl.store(out_pos_ptr + r, tl.load(pos_ptr + r))
        tl.store(out_slot_ptr + r, tl.load(slot_ptr + r))
        tl.store(out_seq_ptr + r, tl.load(seq_ptr + r).to(tl.int32))
        src = table_ptr + tl.load(rows_ptr + r) * table_stride
        dst = out_table_ptr + r.to(tl.int64) * out_table_stride
        for start in range(0, W, BLOCK_W):
            offs = start + tl.arange(0, BLOCK_W)
            keep = offs < W
            tl.store(dst + offs, tl.load(src + offs, mask=keep), mask=keep)
    else:  # padding: writes no KV, attends to one token of its (stale) block table row
        tl.store(out_slot_ptr + r, tl.full([], -1, tl.int64))
        tl.store(out_seq_ptr + r, tl.full([], 1, tl.int32))


def stage_decode_inputs(
    inp: StepInputs,
    last_token: torch.Tensor,
    block_table: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    meta: DecodeGraphBuffers,
    bucket: int,
) -> None:
    """Fill the graphs' static inputs (input_ids, positions, meta) for a decode step of
    b = len(inp.positions) <= bucket rows, on the current stream. inp's seq_lens are the packed
    int64 ones (StepInputs keeps them uncast)."""
    step = (inp.input_ids, inp.prev_row, inp.positions, inp.slot_mapping, inp.seq_lens, inp.rows)
    _launch(step, last_token, block_table, input_ids, positions, meta, bucket)


def warm_up_staging(
    last_token: torch.Tensor,
    block_table: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    meta: DecodeGraphBuffers,
) -> None:
    """Compile the kernel before the run (its one variant: b is not specialised on, the step's
    int64 fields are 16-byte aligned views, the widths are the engine's): a one-row step of table
    row 0, staged into row 0 of the buffers, which every replay stages again."""
    one = torch.zeros(1, dtype=torch.int64, device=last_token.device)
    step = (one, one - 1, one, one - 1, one + 1, one)  # host token 0, position 0, slot -1
    _launch(step, last_token, block_table, input_ids, positions, meta, 1)


def _launch(step, last_token, block_table, input_ids, positions, meta, bucket: int) -> None:
    ids, prev, pos, slots, seq_lens, rows = step
    b = pos.shape[0]
    width = block_table.shape[1]
    assert meta.block_tables.shape[1] == width and b <= bucket <= input_ids.shape[0]
    assert seq_lens.dtype == torch.int64 and block_table.dtype == torch.int32
    _stage_decode_kernel[(bucket,)](
        ids,
        prev,
        pos,
        slots,
        seq_lens,
        rows,
        last_token,
        block_table,
        block_table.stride(0),
        input_ids,
        positions,
        meta.slot_mapping,
        meta.seq_lens,
        meta.block_tables,
        meta.block_tables.stride(0),
        b,
        width,
        BLOCK_W=BLOCK_W,
        num_warps=1,
    )
