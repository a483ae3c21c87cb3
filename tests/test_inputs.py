"""Step inputs: every packed field lands 16-byte aligned (Triton specialises kernels on pointer
alignment, so a field whose offset followed the step's sizes would compile variants mid-run)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bulkgen.engine.inputs import InputPacker
from bulkgen.engine.warmup import _plan


@pytest.mark.parametrize("lengths", [[1], [1, 1, 1], [3, 1], [17, 1, 1, 5, 333], [2, 2, 2, 2, 2]])
def test_every_field_is_16_byte_aligned_whatever_the_step_sizes(lengths):
    block_size = 16
    plan = _plan(lengths, block_size)
    packer = InputPacker(torch.device("cpu"), block_size, 2048, 8, 64)
    packed = packer.pack(plan, None)
    inp = packed.unpack()
    for field in dataclasses.fields(inp):
        tensor = getattr(inp, field.name)
        assert tensor.data_ptr() % 16 == 0, field.name
    assert inp.positions.tolist() == [p for n in lengths for p in range(n)]
    assert inp.query_start_loc.tolist()[-1] == sum(lengths)
    assert inp.seq_lens.tolist() == lengths
    assert inp.rows.tolist() == list(range(len(lengths)))
    assert inp.temperature.tolist() == [1.0] * len(lengths)
    assert inp.top_k.tolist() == [50] * len(lengths)
