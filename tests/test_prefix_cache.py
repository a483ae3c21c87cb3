"""Prefix caching: shared prompt prefixes reuse KV blocks and change no output."""

from __future__ import annotations

from bulkgen import LLM, SamplingParams
from bulkgen.engine.blocks import BlockManager

SYSTEM = list(range(20, 70))  # a 50-token shared prefix, e.g. a system prompt


def prompts() -> list[list[int]]:
    return [SYSTEM + [100 + i, 7 * i % 50 + 3, 9] for i in range(12)] + [SYSTEM[:30], [5, 6]]


def generate(model_dir, prefix_cache: bool, **kw):
    llm = LLM(str(model_dir), device="cpu", block_size=4, prefix_cache=prefix_cache, **kw)
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 10
    params += [SamplingParams(max_tokens=12, temperature=1.0, seed=i) for i in range(4)]
    return llm, llm.generate(prompts(), params)


def test_outputs_are_identical_with_and_without_the_prefix_cache(tiny_model_dir):
    on_llm, on = generate(tiny_model_dir, True)
    _, off = generate(tiny_model_dir, False)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert on_llm.engine.stats["cached_prompt_tokens"] >= 11 * 48
    assert sum(o.num_cached_tokens for o in on) == on_llm.engine.stats["cached_prompt_tokens"]


def test_a_tiny_cache_evicts_cached_blocks_and_still_matches(tiny_model_dir):
    kw = dict(num_blocks=40, max_batch_tokens=24, max_num_seqs=6)
    on_llm, on = generate(tiny_model_dir, True, **kw)
    _, off = generate(tiny_model_dir, False, **kw)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert (
        on_llm.engine.scheduler.num_preemptions > 0 or on_llm.engine.stats["cached_prompt_tokens"]
    )
    blocks = on_llm.engine.scheduler.blocks
    assert blocks.num_free == blocks.num_blocks, "every block is back in the free list"


def test_lookup_matches_only_whole_blocks_of_the_same_chain():
    bm = BlockManager(8, 4, prefix_cache=True)
    a = bm.allocate(2)
    h = bm.register(a[0], None, (1, 2, 3, 4))
    bm.register(a[1], h, (5, 6, 7, 8))
    assert bm.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9], 2) == a
    assert bm.lookup([1, 2, 3, 4, 5, 6, 7, 0], 2) == a[:1]
    assert bm.lookup([0, 2, 3, 4, 5, 6, 7, 8], 2) == []
    assert bm.ref_counts[a[0]] == 3


def test_freed_cached_blocks_are_evicted_last():
    bm = BlockManager(3, 2, prefix_cache=True)
    a = bm.allocate(1)
    bm.register(a[0], None, (1, 2))
    bm.free(a)
    b = bm.allocate(2)
    assert a[0] not in b, "uncached free blocks are used before cached ones"
    assert bm.lookup([1, 2, 3], 1) == a
    c = bm.allocate(0)
    assert c == [] and bm.num_free == 0
