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
