"""Admission to a horizon and max_num_seqs="auto" (issue 16): large batches must not thrash.

Engine-level tests run the tiny random models on the CPU in fp32 (greedy outputs are then the
same whatever the batch); scheduler-level ones drive a Scheduler with chosen token ids.
"""

from __future__ import annotations

import random

import pytest
from click.testing import CliRunner

from bulkgen import LLM, SamplingParams
from bulkgen.config import AUTO_MAX_NUM_SEQS, EngineConfig
from bulkgen.engine.blocks import BlockManager
from bulkgen.engine.request import Request
from bulkgen.engine.scheduler import Scheduler
from bulkgen.engine.step import StepResult

LONG = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


def long_prompts(count: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(10, 300) for _ in range(rng.randrange(12, 30))] for _ in range(count)]


def tight_llm(model_dir, **kw) -> LLM:
    """A cache of 160 tokens: about three of the requests above at their full length."""
    kw = {"dtype": "float32", "device": "cpu", "block_size": 8, "num_blocks": 20,
          "max_batch_tokens": 64, "prefix_cache": False, **kw}  # fmt: skip
    return LLM(str(model_dir), **kw)


def test_a_workload_that_thrashed_finishes_without_recompute_and_with_the_same_outputs(
    tiny_model_dir,
):
    prompts = long_prompts(12)
    # The scenario: with 64 seats and no horizon, the cache fills, and preemption recomputes.
    horizonless = tight_llm(tiny_model_dir, max_num_seqs=64, output_reserve=0.0)
    thrashed = horizonless.generate(prompts, LONG)
    assert horizonless.engine.stats["recomputed_tokens"] > 0.1 * 12 * 48
    small = tight_llm(tiny_model_dir, max_num_seqs=2).generate(prompts, LONG)
    llm = tight_llm(tiny_model_dir, max_num_seqs=64)
    outs = llm.generate(prompts, LONG)
    stats = llm.engine.stats
    assert stats["generated_tokens"] == 12 * 48
    assert stats["recomputed_tokens"] <= 0.02 * stats["generated_tokens"]
    assert stats["preemptions"] == 0, "known lengths are admitted to their end: never evicted"
    assert [o.token_ids for o in outs] == [o.token_ids for o in small]
    assert [o.token_ids for o in outs] == [o.token_ids for o in thrashed]
    assert 2 <= stats["max_running_seqs"] <= 3, "as many as the cache holds to their end"


def test_auto_picks_a_small_batch_for_a_tiny_cache_and_the_ceiling_for_a_big_one(tiny_model_dir):
    prompts = long_prompts(6)
    tiny = tight_llm(tiny_model_dir)  # max_num_seqs="auto" is the default
    outs = tiny.generate(prompts, LONG)
    assert all(len(o.token_ids) == 48 for o in outs)
    stats = tiny.engine.stats
    assert stats["max_num_seqs"] == "auto"
    # 20 blocks of 8 tokens over the 8-10 blocks a request takes to its end.
    assert stats["max_num_seqs_chosen"] == 2 == stats["max_num_seqs_chosen_max"]
    assert stats["max_running_seqs"] <= 2 and stats["preemptions"] == 0
    big = LLM(str(tiny_model_dir), dtype="float32", device="cpu", max_batch_tokens=4096)
    big.generate(prompts, LONG)
    stats = big.engine.stats
    assert stats["max_num_seqs_chosen"] == AUTO_MAX_NUM_SEQS, "bounded by the ceiling"
    assert stats["max_running_seqs"] == 6, "all at once"
    narrow = LLM(str(tiny_model_dir), dtype="float32", device="cpu", max_batch_tokens=64)
    assert narrow.engine.scheduler.admission.cap == 64, "no more rows than a step's tokens"


def test_a_number_still_caps_the_batch(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu", max_num_seqs=3)
    llm.generate(long_prompts(8), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    stats = llm.engine.stats
    assert stats["max_num_seqs"] == 3 == stats["max_num_seqs_chosen"]
    assert stats["max_running_seqs"] == 3


def test_preemption_still_saves_the_run_when_outputs_outgrow_their_horizon(tiny_model_dir):
    prompts = long_prompts(8)
    roomy = LLM(str(tiny_model_dir), dtype="float32", device="cpu").generate(prompts, LONG)
    # A quarter of the output reserved: requests outgrow their horizons in a full cache.
    llm = tight_llm(tiny_model_dir, max_num_seqs=64, output_reserve=0.25)
    outs = llm.generate(prompts, LONG)
    assert llm.engine.stats["preemptions"] > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy]
    blocks = llm.engine.scheduler.blocks
    assert blocks.num_free == blocks.num_blocks and llm.engine.scheduler.admission.promised == 0


def test_stats_report_the_batch_choice_and_the_graph_coverage(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    llm.generate(long_prompts(2), SamplingParams(max_tokens=4, temperature=0.0))
    stats = llm.engine.stats
    for key in ("preemptions", "recomputed_tokens", "max_num_seqs", "max_num_seqs_chosen",
                "max_num_seqs_chosen_max", "max_running_seqs", "output_reserve_share",
                "graph_max_batch", "eager_decode_steps"):  # fmt: skip
        assert key in stats, key
    assert stats["graph_max_batch"] == 0 and stats["eager_decode_steps"] > 0  # no graphs on CPU


# ---- the scheduler alone: token ids chosen by the test ----------------------------------------

EOS = 2


def drive(sched: Scheduler, eos_after: dict[str, int]) -> list:
    """Run to the end as the --sync loop does; a request named in eos_after samples EOS once it
    has that many tokens, every other token is 7."""
    outs = []
    while sched.num_unfinished:
        plan = sched.schedule()
        ids = [
            EOS if len(s.request.output_ids) + 1 >= eos_after.get(s.request.request_id, 1 << 30)
            else 7
            for s in plan.sampled
        ]  # fmt: skip
        sched.update(plan, StepResult(ids=ids))
        outs += sched.take_finished()
    return outs


def scheduler(num_blocks: int, block_size: int = 4, **kw) -> Scheduler:
    cfg = EngineConfig(model="-", block_size=block_size, max_batch_tokens=64, **kw)
    return Scheduler(cfg, BlockManager(num_blocks, block_size), 4096, eos_ids=[EOS])


@pytest.mark.parametrize("seed", range(5))
def test_requests_of_known_length_are_never_preempted(seed):
    rng = random.Random(seed)
    sched = scheduler(num_blocks=rng.randrange(24, 80), max_num_seqs=512)
    wanted = {}
    for i in range(60):
        n, out = rng.randrange(1, 40), rng.randrange(1, 50)
        params = SamplingParams(max_tokens=out, ignore_eos=True)
        sched.add(Request(str(i), [5] * n, params, seed=0))
        wanted[str(i)] = out
    outs = drive(sched, {})
    assert sched.num_preemptions == 0 and sched.num_recomputed == 0
    assert {o.request_id: len(o.token_ids) for o in outs} == wanted
    assert sched.admission.promised == 0 and sched.blocks.num_free == sched.blocks.num_blocks


def test_the_share_is_learned_from_finished_requests_and_preemption_catches_a_long_tail():
    sched = scheduler(num_blocks=40, max_num_seqs=512)
    short = {str(i): 2 for i in range(100)}  # end at EOS after 2 of their 64 tokens
    for i in range(105):
        sched.add(Request(str(i), [5] * 8, SamplingParams(max_tokens=64), seed=0))
    outs = drive(sched, short)
    assert sched.admission.share.value <= 0.1, "most requests used a few % of their budget"
    # The last 5 run to 64 tokens: admitted on that share, they outgrew it together.
    assert sched.num_preemptions > 0
    assert sorted(len(o.token_ids) for o in outs) == [2] * 100 + [64] * 5
    assert sched.admission.promised == 0 and sched.blocks.num_free == sched.blocks.num_blocks


def test_a_blocked_request_is_not_looked_up_again_until_room_grows(monkeypatch):
    sched = scheduler(num_blocks=20, max_num_seqs=512)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for i in range(3):
        sched.add(Request(str(i), [5] * 30, params, seed=0))  # 70 tokens: 18 blocks each
    lookups = []
    lookup = sched.blocks.lookup
    monkeypatch.setattr(sched.blocks, "lookup", lambda *a: lookups.append(1) or lookup(*a))
    for _ in range(10):  # decode steps of the first request; no block frees
        sched.update(plan := sched.schedule(), StepResult(ids=[7] * len(plan.sampled)))
    assert len(sched.running) == 1 and len(lookups) == 2, "one admission, one failed attempt"


# ---- the flag --------------------------------------------------------------------------------


def test_max_num_seqs_takes_a_number_or_auto():
    assert EngineConfig(model="-").max_num_seqs == "auto"
    assert EngineConfig(model="-", max_num_seqs=512).seq_rows == 512
    for bad in (0, "many", 1.5, True):
        with pytest.raises(ValueError, match="max_num_seqs"):
            EngineConfig(model="-", max_num_seqs=bad)
    with pytest.raises(ValueError, match="output_reserve"):
        EngineConfig(model="-", output_reserve=1.5)
    assert EngineConfig(model="-", auto_max_num_seqs=300).seq_rows == 300
    assert EngineConfig(model="-", auto_max_num_seqs=300, max_batch_tokens=128).seq_rows == 128
    assert EngineConfig(model="-", max_num_seqs=512, auto_max_num_seqs=300).seq_rows == 512
    for bad in (0, 2.5, "x"):
        with pytest.raises(ValueError, match="auto_max_num_seqs"):
            EngineConfig(model="-", auto_max_num_seqs=bad)


def test_auto_s_ceiling_is_a_setting_and_reported(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    assert llm.engine.stats["max_num_seqs_ceiling"] == AUTO_MAX_NUM_SEQS
    fixed = LLM(str(tiny_model_dir), dtype="float32", device="cpu", auto_max_num_seqs=3)
    fixed.generate(long_prompts(5), SamplingParams(max_tokens=4, temperature=0.0))
    stats = fixed.engine.stats
    assert stats["max_num_seqs_ceiling"] == 3 == stats["max_num_seqs_chosen"]
    assert stats["max_running_seqs"] == 3, "the ceiling holds the batch"


def test_the_flag_accepts_auto_and_names_a_bad_value():
    from bulkgen.cli import main, run

    param = next(p for p in run.params if p.name == "max_num_seqs")
    assert param.type.convert("auto", param, None) == "auto"
    assert param.type.convert("512", param, None) == 512
    result = CliRunner().invoke(main, ["run", "in.jsonl", "--max-num-seqs", "lots"])
    assert result.exit_code == 2 and "neither a number" in result.output


def test_a_recipe_field_and_the_run_config_take_auto(tmp_path):
    from bulkgen.cli import run
    from bulkgen.recipes import load_recipe
    from bulkgen.run_config import RunConfig

    for value in ("auto", 512):
        (tmp_path / "job.yaml").write_text(f"max_num_seqs: {value}\n")
        assert load_recipe(tmp_path / "job.yaml", run).options["max_num_seqs"] == value
        config = RunConfig(inputs=("x.jsonl",), out="o", model="m", max_num_seqs=value)
        assert config.engine_config("m").max_num_seqs == value
    assert RunConfig(inputs=("x.jsonl",), out="o", model="m").engine_config("m").auto_num_seqs


def test_the_warm_up_fits_a_cache_smaller_than_its_plans(tiny_model_dir):
    from bulkgen.engine.warmup import warmup_plans

    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu", num_blocks=6)
    engine = llm.engine
    plans = warmup_plans(engine.cfg, engine.max_model_len, num_blocks=6)
    assert len(plans[-1].seqs) == engine.cfg.graph_rows == 1024, "the widest decode step"
    assert all(b < 6 for p in plans for s in p.seqs for b in s.request.block_ids)
    engine.runner.warm_up(plans)  # no index past the cache (on the GPU: no illegal access)


def test_graph_buckets_cover_every_decode_step_up_to_auto_s_ceiling():
    from bulkgen.engine.graphs import bucket_sizes

    rows = EngineConfig(model="-").graph_rows
    buckets = bucket_sizes(rows)
    assert rows == AUTO_MAX_NUM_SEQS == buckets[-1] and len(buckets) <= 40
    for b in range(257, rows + 1):
        assert next(s for s in buckets if s >= b) <= b * 9 / 8, "padding under 1/8 past 256"


@pytest.mark.gpu
def test_auto_decodes_every_batch_size_from_graphs_on_cuda(tiny_model_dir):
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cuda")
    llm.generate(long_prompts(300), params)
    stats = llm.engine.stats
    assert stats["graph_max_batch"] == AUTO_MAX_NUM_SEQS == stats["max_num_seqs_ceiling"]
    assert stats["max_running_seqs"] == 300 and stats["eager_decode_steps"] == 0
    low = LLM(str(tiny_model_dir), dtype="float32", device="cuda", auto_max_num_seqs=256)
    low.generate(long_prompts(300), params)
    stats = low.engine.stats
    assert stats["max_num_seqs_ceiling"] == 256 == stats["graph_max_batch"]
    assert stats["max_running_seqs"] == 256 and stats["eager_decode_steps"] == 0


def test_stats_json_reports_the_batch_choice_and_what_preemption_cost(tmp_path, tiny_model_dir):
    import json

    from bulkgen.cli import main

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"Row {i} says"}) + "\n" for i in range(5)))
    out = tmp_path / "out"
    args = ["run", str(inp), "-m", str(tiny_model_dir), "-o", str(out), "--max-tokens", "4", "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["max_num_seqs"] == "auto" and stats["max_running_seqs"] == 5
    assert stats["max_num_seqs_chosen"] == AUTO_MAX_NUM_SEQS, "a roomy cache: the ceiling"
    assert stats["preemptions"] == 0 == stats["recomputed_tokens"]
