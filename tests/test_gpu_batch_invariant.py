"""--batch-invariant on the GPU (issue 15), Llama-3-8B shape, dummy bf16 weights: 16 seeded,
sampled prompts give the same tokens and logprob bits alone, inside 240 others, from the
synchronous loop with their prefixes cached, and with --max-num-seqs 64 under forced preemption."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from bulkgen import SamplingParams
from bulkgen.config import EngineConfig
from bulkgen.engine.engine import Engine
from bulkgen.model.shapes import LLAMA3_8B

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def random_prompts(n: int, low: int, high: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(low, high, (n,), generator=gen)
    return [torch.randint(1000, 120000, (int(k),), generator=gen).tolist() for k in lens]


WATCHED = random_prompts(16, 16, 600, seed=1)
PARAMS = [
    SamplingParams(
        max_tokens=100, temperature=1.0, top_p=0.95, seed=100 + i, logprobs=1, ignore_eos=True
    )
    for i in range(16)
]
OTHERS = random_prompts(240, 16, 1024, seed=2)
FILLERS = [
    SamplingParams(max_tokens=100 + 2 * i, temperature=0.8, seed=i, ignore_eos=True)
    for i in range(240)
]


def run(engine: Engine, tag: str, watched: list[int]) -> dict[int, tuple]:
    """Runs the watched prompts (indices) among the others, or alone when the batch is only
    them; returns each watched prompt's (tokens, logprobs)."""
    for i in watched:
        engine.add(f"{tag}-w{i}", WATCHED[i], PARAMS[i])
    outs = {}
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id] = (o.token_ids, o.logprobs)
    return {i: outs[f"{tag}-w{i}"] for i in watched}


def run_among_others(engine: Engine, tag: str) -> dict[int, tuple]:
    # The watched prompts join in the middle of the others, and run to the end with them.
    for i, (p, sp) in enumerate(zip(OTHERS[:120], FILLERS[:120], strict=True)):
        engine.add(f"{tag}-o{i}", p, sp)
    for _ in range(3):
        engine.step()
    for i, (p, sp) in enumerate(zip(OTHERS[120:], FILLERS[120:], strict=True)):
        engine.add(f"{tag}-o{120 + i}", p, sp)
    return run(engine, tag, list(range(16)))


def test_seeded_rows_are_bit_identical_alone_among_others_and_under_preemption():
    cfg = EngineConfig(
        model="llama3-8b-dummy", load_format="dummy", max_model_len=4096, batch_invariant=True
    )
    engine = Engine(cfg, model_config=dict(LLAMA3_8B))
    alone = {}
    for i in range(16):
        alone.update(run(engine, f"alone{i}", [i]))
    assert all(len(t) == 100 for t, _ in alone.values())
    assert run_among_others(engine, "mates") == alone
    engine.async_loop = False  # and the prompts' prefixes are cached now
    assert run_among_others(engine, "sync") == alone
    assert engine.stats["cached_prompt_tokens"] > 0
    engine.close()
    del engine
    gc.collect()
    torch.cuda.empty_cache()

    # 64 rows at most, and a cache of 24K tokens for 256 requests of up to 1.3K tokens with no
    # output reserve at admission: requests are preempted and recomputed through prefill.
    small = dataclasses.replace(cfg, max_num_seqs=64, num_blocks=1500, output_reserve=0.0)
    engine = Engine(small, model_config=dict(LLAMA3_8B))
    assert run_among_others(engine, "small") == alone
    assert engine.stats["preemptions"] > 0, engine.stats
    engine.close()


def test_a_resumed_job_on_cuda_writes_the_rows_of_an_uninterrupted_one(tmp_path, tiny_model_dir):
    """bf16 on CUDA, the tiny model: shards lost to a crash are regenerated among other rows
    (the CPU test does the same in float32: test_batch_invariant.py)."""
    import json
    import random

    from click.testing import CliRunner

    from bulkgen.cli import main

    rng = random.Random(5)
    words = ["sea", "tree", "blue", "cat", "run", "hello", "code", "sun", "why", "list"]
    lines = [
        json.dumps({"id": f"r{i}", "prompt": " ".join(rng.choices(words, k=rng.randint(2, 30)))})
        for i in range(60)
    ]
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("\n".join(lines) + "\n")
    common = [inputs, "-m", tiny_model_dir, "--device", "cuda", "--dtype", "bfloat16", "-q",
              "--format", "jsonl", "--shard-size", "7", "--max-tokens", "24",
              "--temperature", "1.0", "--seed", "3", "--logprobs", "1",
              "--max-num-seqs", "16", "--batch-invariant"]  # fmt: skip

    def run(out):
        result = CliRunner().invoke(main, [str(a) for a in ["run", *common, "-o", out]])
        assert result.exit_code == 0, result.output

    def rows(out):
        return {
            json.loads(line)["id"]: json.loads(line)
            for path in sorted(out.glob("part-*.jsonl"))
            for line in path.read_text().splitlines()
        }

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run(whole)
    run(resumed)
    shards = sorted(resumed.glob("part-*.jsonl"))
    for lost in (shards[0], shards[3], shards[-1]):
        lost.unlink()
    run(resumed)
    assert len(rows(resumed)) == 60 and rows(resumed) == rows(whole)
