"""scripts/bench_eager_host.py's steps run through the real packer and runner (on the CPU here,
where only the plan and the calls are checked: the kernels run inside the launch)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_eager_host import step_plan, time_launches  # noqa: E402

from bulkgen import LLM  # noqa: E402


def test_a_mixed_and_a_decode_step_launch_and_are_timed(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), device="cpu", dtype="float32").engine
    blocks = engine.scheduler.blocks.num_blocks
    mixed = step_plan(5, 40, 23, engine.cfg.block_size, blocks)
    assert [s.num_tokens for s in mixed.seqs] == [1] * 5 + [23] and not mixed.decode_only
    assert [s.start for s in mixed.seqs] == [39] * 5 + [0]
    assert all(b < blocks for s in mixed.seqs for b in s.request.block_ids)
    line = time_launches(engine, mixed, reps=2, profile=True)
    assert line["host_ms_median"] > 0 and line["gpu_ms_median"] is None
    assert len(line["host_ms_first_two"]) == 2 and min(line["host_ms_first_two"]) > 0
    assert line["profile_own_ms"] and all(len(row) == 3 for row in line["profile_own_ms"])
    decode = step_plan(5, 40, 0, engine.cfg.block_size, blocks)
    assert decode.decode_only and time_launches(engine, decode, 1, False)["host_ms_median"] > 0
    several = step_plan(5, 40, 23, engine.cfg.block_size, blocks, prompts=3)
    assert [(s.start, s.num_tokens) for s in several.seqs[5:]] == [(0, 9), (0, 7), (0, 7)]
    assert len(several.seqs) == 8 and time_launches(engine, several, 1, False)["host_ms_median"] > 0


def test_with_mixed_graphs_the_mixed_step_goes_through_the_pieces(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), device="cpu", dtype="float32", mixed_graphs=True).engine
    plan = step_plan(5, 40, 23, engine.cfg.block_size, engine.scheduler.blocks.num_blocks)
    time_launches(engine, plan, reps=1, profile=False)
    assert engine.runner.mixed_graphs.steps == 3, "two untimed launches and one timed"


def test_shuffled_blocks_are_distinct_cache_blocks_in_no_run(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), device="cpu", dtype="float32").engine
    blocks, size = engine.scheduler.blocks.num_blocks, engine.cfg.block_size
    plan = step_plan(3, 4 * size, 0, size, blocks, shuffled=True)
    ids = [b for s in plan.seqs for b in s.request.block_ids]
    assert len(ids) == len(set(ids)) == 12 and all(0 <= b < blocks for b in ids)
    assert ids != sorted(ids), "a seeded permutation, not the consecutive blocks"
    again = step_plan(3, 4 * size, 0, size, blocks, shuffled=True)
    assert [b for s in again.seqs for b in s.request.block_ids] == ids
