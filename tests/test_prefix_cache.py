"""Prefix caching: shared prompt prefixes reuse KV blocks and change no output."""

from __future__ import annotations

from bulkgen import LLM, SamplingParams
from bulkgen.config import EngineConfig
from bulkgen.engine import blocks as blocks_module
from bulkgen.engine.blocks import BlockManager
from bulkgen.engine.request import Request
from bulkgen.engine.scheduler import Scheduler
from bulkgen.engine.step import StepResult

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
    kw = dict(num_blocks=40, max_batch_tokens=24, max_num_seqs=6, output_reserve=0.0)
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


# ---- keys: a digest collision never reuses KV computed after a different prefix ---------------

B0, A0, A1 = (20, 21, 22, 23), (30, 31, 32, 33), (40, 41, 42, 43)


def collide_first_blocks(monkeypatch) -> None:
    """Make the root block A0 share B0's digest, as a crafted collision of a weak hash would."""
    real = blocks_module.block_digest

    def digest(parent, tokens):
        return real(None, B0) if parent is None and tuple(tokens) == A0 else real(parent, tokens)

    monkeypatch.setattr(blocks_module, "block_digest", digest)


def test_block_keys_are_128_bit_digests_of_the_parent_key_and_the_tokens():
    root = blocks_module.block_digest(None, A0)
    assert len(root) == 16 and root != blocks_module.block_digest(None, B0)
    assert blocks_module.block_digest(root, A1) != blocks_module.block_digest(None, A1)
    assert blocks_module.block_digest(root, A1) == blocks_module.block_digest(root, A1)


def test_a_block_cached_after_a_colliding_parent_is_not_reused(monkeypatch):
    collide_first_blocks(monkeypatch)
    bm = BlockManager(8, 4, prefix_cache=True)
    r, p = bm.allocate(1), bm.allocate(2)
    bm.register(r[0], None, B0)  # R = B0 ...: its first block is cached under the digest
    key = bm.register(p[0], None, A0)  # P = A0 A1: same digest, other tokens: not cached
    bm.register(p[1], key, A1)
    assert bm.lookup([*A0, *A1, 9], 2) == [], "A0 is not B0, whatever their digests"
    assert bm.lookup([*B0, *A1, 9], 2) == r, "A1 was computed after A0, not after B0"


def test_a_child_is_not_reused_after_its_parent_block_was_rewritten(monkeypatch):
    collide_first_blocks(monkeypatch)
    bm = BlockManager(3, 4, prefix_cache=True)
    a = bm.allocate(2)
    bm.register(a[1], bm.register(a[0], None, B0), A1)  # B0 A1
    bm.free(a)
    assert bm.allocate(2)[1] == a[0], "the parent is evicted, its child stays cached"
    bm.register(a[0], None, A0)  # same block, same digest, now after other tokens
    assert bm.lookup([*A0, *A1, 9], 2) == [a[0]], "A1 was computed after B0, not after A0"


def test_forced_collisions_change_no_output_at_engine_level(tiny_model_dir, monkeypatch):
    collide_first_blocks(monkeypatch)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    r, p, q = [*B0, 50, 51, 52, 53, 9], [*A0, *A1, 9], [*B0, *A1, 9]
    outs = {}
    for cache in (True, False):
        llm = LLM(str(tiny_model_dir), device="cpu", block_size=4, prefix_cache=cache)
        outs[cache] = [llm.generate([prompt], params)[0] for prompt in (r, p, q)]
    assert [o.token_ids for o in outs[True]] == [o.token_ids for o in outs[False]]
    assert outs[True][2].num_cached_tokens == 4, "Q reuses R's first block and nothing else"


def test_a_constant_digest_changes_no_output(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(blocks_module, "block_digest", lambda parent, tokens: b"\0" * 16)
    _, on = generate(tiny_model_dir, True)
    _, off = generate(tiny_model_dir, False)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]


# ---- cached_prompt_tokens: what admitted requests took from the cache, once each -------------


def run_scheduler(num_blocks: int, max_batch_tokens: int, batches) -> tuple[Scheduler, list]:
    """Drive a Scheduler as the --sync loop does (every sampled id is 7); batches run in turn.
    No admission horizon (output_reserve 0) and seats for all, so that a full cache preempts."""
    cfg = EngineConfig(model="unused", block_size=4, max_batch_tokens=max_batch_tokens,
                       max_num_seqs=256, output_reserve=0.0)  # fmt: skip
    sched = Scheduler(cfg, BlockManager(num_blocks, 4, prefix_cache=True), 512, eos_ids=[])
    outs = []
    for b, batch in enumerate(batches):
        for i, (prompt, max_tokens) in enumerate(batch):
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            sched.add(Request(f"{b}-{i}", prompt, params, seed=0))
        while sched.num_unfinished:
            plan = sched.schedule()
            sched.update(plan, StepResult(ids=[7] * len(plan.sampled)))
            outs += sched.take_finished()
    return sched, sorted(outs, key=lambda o: o.request_id)


PROMPT = list(range(100, 117))  # 4 full blocks and one token


def test_failed_admission_attempts_count_no_cached_tokens():
    # The second request finds 16 cached tokens each step but no free block until the first ends.
    warm, other, again = [(PROMPT, 1)], (list(range(200, 208)), 4), (PROMPT + [5, 6, 7], 4)
    sched, outs = run_scheduler(7, 4, [warm, [other, again]])
    assert [o.num_cached_tokens for o in outs] == [0, 0, 16]
    assert sched.num_cached_tokens == 16


def test_a_request_preempted_and_readmitted_is_counted_once(monkeypatch):
    preempted = []
    preempt = Scheduler._preempt
    monkeypatch.setattr(
        Scheduler, "_preempt", lambda s, r: preempted.append(r.request_id) or preempt(s, r)
    )
    warm, other = [(PROMPT, 1)], (list(range(200, 208)), 8)
    again = (PROMPT + list(range(5, 16)), 8)  # its own 11 tokens are prefilled 4 at a time
    sched, outs = run_scheduler(8, 4, [warm, [other, again]])
    assert preempted.count("1-1") > 1, "the scenario: re-admitted several times"
    assert [o.num_cached_tokens for o in outs] == [0, 0, 16]
    assert sched.num_cached_tokens == 16
