"""scripts/sweep_decode_large.py's launches (the sweep itself times them on the GPU machine): the
table's own first, then every combination of the lists asked for, prefetched and not, a
register bound of 0 meaning none."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see test_triton_kernels)
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from sweep_decode_large import launch_list  # noqa: E402

from bulkgen.model.attention.decode_tiling import DecodeLaunch  # noqa: E402


def test_the_tables_launch_then_the_product_of_the_lists():
    current = DecodeLaunch(128, 4, 3, prefetch_blocks=True)
    launches = launch_list(current, [128], [4], [2, 3], [0, 96])
    assert launches[0] == current and len(launches) == 1 + 2 * 2 * 2
    assert DecodeLaunch(128, 4, 2, prefetch_blocks=True, max_registers=96) in launches
    assert DecodeLaunch(128, 4, 3) in launches
    assert {launch.max_registers for launch in launches[1:]} == {None, 96}
    assert {launch.prefetch_blocks for launch in launches[1:]} == {False, True}


def test_heads_first_adds_each_launch_in_that_order_too():
    current = DecodeLaunch(128, 4, 3, prefetch_blocks=True)
    launches = launch_list(current, [128], [4], [2], [0], heads_first=True)
    assert launches[:2] == [current, current._replace(heads_first=True)]
    assert len(launches) == 2 + 2 * 2
    assert sum(launch.heads_first for launch in launches) == len(launches) // 2
