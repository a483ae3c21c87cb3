"""The decode kernel's measured launches: decode_tilings.json's per-batch buckets, and how
scripts/tune_decode.py chooses them (the launch per batch size, the value layout) from timings."""

from __future__ import annotations

import functools
import importlib
import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see test_triton_kernels)
    os.environ["TRITON_INTERPRET"] = "1"

from bulkgen.model.attention import decode_tiling  # noqa: E402


def tune_decode(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
    return importlib.import_module("tune_decode")


def test_a_measured_table_picks_the_launch_by_batch_size(monkeypatch):
    """decode_tilings.json lists launches by the largest batch each is for; the last (max_batch
    null) takes every larger batch, and a batch-less call (benchmarks) the largest's."""
    table = {
        "fp8": {
            "128": [
                {"max_batch": 32, "block_n": 64, "v_in_registers": True},
                {"max_batch": 256, "block_n": 128, "num_warps": 8},
                {"max_batch": None, "block_n": 256},
            ]
        }
    }
    monkeypatch.setattr(decode_tiling, "measured_launches", lambda: table)
    launch = functools.partial(decode_tiling.decode_launch, 128, True)
    assert launch(1) == launch(32) == decode_tiling.DecodeLaunch(64, v_in_registers=True)
    assert launch(33) == launch(256) == decode_tiling.DecodeLaunch(128, 8)
    assert launch(257).block_n == launch(4096).block_n == launch(None).block_n == 256
    assert decode_tiling.decode_launch(128, False, 1).block_n == 64  # no "auto" entry


def test_a_16_bit_cache_takes_the_launches_measured_for_the_model_dtype(monkeypatch):
    """Entries under "auto" (tune_decode.py --kv-cache-dtype auto) serve a bf16/fp16 cache by
    batch; any other kind without fp8 (a float32 cache: "-") keeps the default tiles."""
    small = {"max_batch": 32, "block_n": 64, "num_stages": 4, "prefetch_blocks": True}
    table = {"auto": {"128": [small, {"max_batch": None, "block_n": 32}]}}
    monkeypatch.setattr(decode_tiling, "measured_launches", lambda: table)
    launch = functools.partial(decode_tiling.decode_launch, 128, False)
    assert launch(32, "auto") == decode_tiling.DecodeLaunch(64, 4, 4, prefetch_blocks=True)
    assert launch(33, "auto") == decode_tiling.DecodeLaunch(32)
    assert launch(32, "-") == launch(32) == decode_tiling.DecodeLaunch(64)
    assert decode_tiling.decode_launch(128, True, 32).block_n == 128  # no fp8 entry: 2 x 64


def test_the_tuner_keeps_each_batch_sizes_fastest_launch(monkeypatch):
    """tune_decode.py's table: per batch the launch with the smallest geometric mean over that
    batch's contexts; neighbours with the same launch merge, the last bucket is open-ended."""
    tune = tune_decode(monkeypatch)
    a, b = decode_tiling.DecodeLaunch(64), decode_tiling.DecodeLaunch(128, v_in_registers=True)
    # SHAPES: batches 32, 256, 512 at contexts 1024 and 2048. a wins at 32 only.
    results = [(a, [1.0, 1.0, 5.0, 5.0, 9.0, 9.0]), (b, [2.0, 2.0, 4.0, 4.0, 8.0, 8.0])]
    entries = tune.per_batch_best(results)
    assert entries == [
        {"max_batch": 32, **a._asdict()},
        {"max_batch": None, **b._asdict()},
    ]
    assert tune.per_batch_best([results[1]]) == [{"max_batch": None, **b._asdict()}]


def test_the_tuner_keeps_the_value_layout_whose_best_launches_are_fastest(monkeypatch):
    """A layout wins on its per-batch best launches, not on any single launch's times."""
    tune = tune_decode(monkeypatch)
    a, b = decode_tiling.DecodeLaunch(64), decode_tiling.DecodeLaunch(128)
    # rows: a at 32 rows and b above, each best where it runs: 1, 1, 2, 2, 2, 2.
    rows = [(a, [1.0, 1.0, 9.0, 9.0, 9.0, 9.0]), (b, [9.0, 9.0, 2.0, 2.0, 2.0, 2.0])]
    # slots inner: one launch, 1.5 everywhere: no single rows launch beats it, the pair does not.
    slots_inner = [(a, [1.5] * 6)]
    assert tune.best_layout({"rows": rows, "slots_inner": slots_inner}) == "slots_inner"
    slots_inner = [(a, [2.5] * 6)]
    assert tune.best_layout({"rows": rows, "slots_inner": slots_inner}) == "rows"


def test_a_measured_split_count_is_what_the_kernel_launches_with(monkeypatch):
    """An entry's "splits" replaces num_kv_splits' choice for its batches (the same outputs as
    that count passed explicitly, and the kernel's grid has that many splits); an entry without
    one leaves the count to num_kv_splits."""
    from test_triton_kernels import DEVICE, paged_kv

    from bulkgen.model.attention import triton_decode

    table = {
        "fp8": {
            "32": [{"max_batch": 2, "block_n": 16, "splits": 3}, {"max_batch": None, "block_n": 16}]
        }
    }
    monkeypatch.setattr(decode_tiling, "measured_launches", lambda: table)
    seq_lens = [40, 70]
    k, v, tables = paged_kv(seq_lens, 8, 2, 32, torch.float32)
    k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    q = torch.randn(len(seq_lens), 4, 32, device=DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    grids = []
    real = triton_decode._decode_split_kernel

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(triton_decode, "_decode_split_kernel", Spy())
    measured = triton_decode.paged_decode(q, k, v, lens, tables, 32**-0.5)
    assert grids[-1] == (2, 2, 3)
    explicit = triton_decode.paged_decode(q, k, v, lens, tables, 32**-0.5, num_splits=3)
    assert torch.equal(measured, explicit)
    monkeypatch.setattr(triton_decode, "num_kv_splits", lambda *args: 5)
    triton_decode.paged_decode(q.repeat(2, 1, 1), k, v, lens.repeat(2), tables.repeat(2, 1), 1.0)
    assert grids[-1] == (4, 2, 5)  # 4 rows: the second entry, no splits of its own


def test_the_tuner_keeps_a_split_count_only_where_it_beats_the_heuristic(monkeypatch):
    tune = tune_decode(monkeypatch)
    a = decode_tiling.DecodeLaunch(64)._asdict()
    entries = [{"max_batch": 32, **a}, {"max_batch": None, **a}]
    assert [tune.entry_of(entries, b) for b in (1, 32, 33, 512)] == [0, 0, 1, 1]
    split_times = [
        {None: [2.0, 2.0], 1: [1.0, 1.5], 2: [1.9, 2.1]},  # 1 split beats the heuristic
        {None: [3.0, 3.0], 1: [3.0, 3.0], 4: [3.5, 3.1]},  # a tie: the heuristic stays
    ]
    chosen = tune.with_best_splits(entries, split_times)
    assert [e["splits"] for e in chosen] == [1, None]
    assert decode_tiling.launch_for_batch(chosen, 8).splits == 1


def test_another_table_is_read_where_the_switch_names_one(tmp_path, monkeypatch):
    """BULKGEN_DECODE_TILINGS names a table read instead of decode_tilings.json (A/B runs of two
    tables in one call); a name that is no file fails rather than falling back to no table."""
    other = tmp_path / "tilings.json"
    entry = {"max_batch": None, "block_n": 32, "num_warps": 8}
    other.write_text(json.dumps({"launches": {"fp8": {"128": [entry]}}}))
    monkeypatch.setenv(decode_tiling.TILINGS_ENV, str(other))
    decode_tiling.measured_table.cache_clear()
    try:
        assert decode_tiling.decode_launch(128, True, 900) == decode_tiling.DecodeLaunch(32, 8)
        monkeypatch.setenv(decode_tiling.TILINGS_ENV, str(tmp_path / "missing.json"))
        decode_tiling.measured_table.cache_clear()
        with pytest.raises(FileNotFoundError, match="BULKGEN_DECODE_TILINGS names"):
            decode_tiling.measured_table()
    finally:
        monkeypatch.delenv(decode_tiling.TILINGS_ENV)
        decode_tiling.measured_table.cache_clear()


def test_the_shipped_table_serves_fp8_batches_above_512_with_its_own_launch():
    """Measured at trt's 857 rows (sweep_decode_large.py): 128-token tiles, 3 stages, block ids
    loaded ahead, the grid heads first; 512 rows keep the launch tuned there."""
    launch = functools.partial(decode_tiling.decode_launch, 128, True)
    assert launch(857) == decode_tiling.DecodeLaunch(
        128, 4, 3, prefetch_blocks=True, heads_first=True
    )
    assert launch(512) == decode_tiling.DecodeLaunch(128, 4, 2)
