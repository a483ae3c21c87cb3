"""An fp8 cache's paired first blocks (model/attention/kv_pairs.py): the arithmetic, the block
manager's partners, and whole engine runs on the CPU (torch backend) against an fp32 cache that
holds the same values, through chunked prefill, prefix-cache hits and preemption. The Triton
kernels: test_kv_pairs_kernels.py."""

from __future__ import annotations

import pytest
import torch

from bulkgen import LLM, SamplingParams
from bulkgen.engine.blocks import BlockManager
from bulkgen.model.attention import kv_pairs, torch_backend
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE, dequantize, quantize


def greedy(max_tokens=12):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def pair_rounded(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What a paired first block gives back for x: hi + lo * LO_SCALE, times the scale."""
    hi = quantize(x, scale)
    return kv_pairs.join(hi, kv_pairs.low_part(x, hi, scale)) * scale


@pytest.mark.parametrize("scale", [1.0, 0.25, 3.0])
def test_a_pair_keeps_about_bf16s_precision_where_e4m3_alone_keeps_a_sixteenth(scale):
    """Within 2**-8 of |x| (bf16's half of 2**-7), or 2**-14 scale units where e4m3 has only
    subnormals (the low part's own last place over 16); plain e4m3 is 8x coarser."""
    x = torch.randn(100_000) * torch.logspace(-4, 2, 100_000) * scale
    bound = torch.maximum(x.abs() * 2**-8, torch.tensor(2**-14 * scale))
    assert ((pair_rounded(x, scale) - x).abs() <= bound).all()
    assert ((dequantize(quantize(x, scale), scale) - x).abs() > 4 * bound).any()


def test_the_torch_write_stores_low_parts_at_the_partner_and_the_read_adds_them():
    blocks, bs, heads, dim = 6, 4, 2, 8
    k_cache = torch.zeros(blocks, bs, heads, dim).to(FP8_DTYPE)
    v_cache = torch.zeros_like(k_cache)
    partners = torch.full((blocks,), -1, dtype=torch.int32)
    partners[1] = 4  # block 1 is a first block, block 4 its partner
    slots = torch.tensor([4, 5, 6, 8, 9])  # block 1 (slots 4-6), block 2 (8, 9)
    k, v = torch.randn(5, heads, dim) * 3, torch.randn(5, heads, dim)
    torch_backend.write_kv(k, v, k_cache, v_cache, slots, 0.5, 2.0, partners=partners)
    got_k = torch_backend._read(k_cache, torch.tensor([1, 2]), 0.5, partners).view(-1, heads, dim)
    got_v = torch_backend._read(v_cache, torch.tensor([1, 2]), 2.0, partners).view(-1, heads, dim)
    at = torch.tensor([0, 1, 2, 4, 5])  # the slots' rows among blocks 1 and 2
    assert torch.equal(got_k[at[:3]], pair_rounded(k[:3], 0.5))
    assert torch.equal(got_v[at[:3]], pair_rounded(v[:3], 2.0))
    assert torch.equal(got_k[at[3:]], dequantize(quantize(k[3:], 0.5), 0.5))  # no partner
    assert torch.equal(got_v[at[3:]], dequantize(quantize(v[3:], 2.0), 2.0))
    assert k_cache[4].float().abs().sum() > 0 and k_cache[3].float().abs().sum() == 0


# ---- the block manager ---------------------------------------------------------------------


def test_a_first_allocation_takes_a_partner_that_costs_one_block():
    bm = BlockManager(10, 4, pair_first=True)
    assert (bm.cost(0), bm.cost(1), bm.cost(9)) == (0, 2, 4)
    assert (bm.held([]), bm.held([3, 4])) == (0, 3)
    first = bm.allocate(bm.cost(9), first=True)
    assert len(first) == 3 and bm.num_free == 6
    partner = bm.partner[first[0]]
    assert partner >= 0 and partner not in first and bm.partner[first[1]] == -1
    assert bm.take_partner_changes() == {first[0]: partner}
    more = bm.allocate(1)  # a later block of the same sequence: no partner
    assert bm.partner[more[0]] == -1 and bm.take_partner_changes() == {}
    bm.free((first + more)[::-1])
    assert bm.num_free == 10 and bm.partner[first[0]] == -1
    assert bm.take_partner_changes() == {first[0]: -1}


def test_a_cached_first_block_keeps_its_partner_until_it_is_evicted():
    bm = BlockManager(4, 2, prefix_cache=True, pair_first=True)
    a = bm.allocate(bm.cost(2), first=True)
    partner = bm.partner[a[0]]
    bm.register(a[0], None, (1, 2))
    bm.free(a)
    assert bm.partner[a[0]] == partner and len(bm.free_ids) == 3, "kept with its cached block"
    assert bm.num_free == 4, "and counted free: evicting the block frees it"
    assert bm.lookup([1, 2, 3], 1) == a and bm.partner[a[0]] == partner  # shared back
    bm.free(a)
    bm.take_partner_changes()
    taken = bm.allocate(4)  # evicts the cached block: its partner comes free as well
    assert sorted(taken) == [0, 1, 2, 3] and bm.partner[a[0]] == -1
    assert bm.take_partner_changes() == {a[0]: -1}


def test_without_pairs_nothing_changes():
    bm = BlockManager(4, 2)
    assert bm.cost(3) == bm.blocks_for(3) == 2 and bm.held([1]) == 1
    assert len(bm.allocate(2, first=True)) == 2 and bm.take_partner_changes() == {}


# ---- whole runs ------------------------------------------------------------------------------


def test_pairs_are_on_when_asked_for_and_stats_say_so(tiny_model_dir, allow_fp8):
    kw = dict(dtype="float32", device="cpu", num_blocks=64, block_size=4, kv_cache_dtype="fp8")
    on = LLM(str(tiny_model_dir), fp8_kv_pair_first_block=True, **kw).engine
    off = LLM(str(tiny_model_dir), **kw)
    plain = LLM(str(tiny_model_dir), **kw).engine
    assert on.stats["fp8_kv_pair_first_block"] is True and on.scheduler.blocks.pair_first
    assert off.engine.stats["fp8_kv_pair_first_block"] is False
    assert plain.stats["fp8_kv_pair_first_block"] is False and plain.runner.tables.partners is None


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_paired_run_equals_an_fp32_run_of_the_same_rounded_values(
    tiny_model_dir, allow_fp8, monkeypatch, prefix_cache
):
    """The engine with paired first blocks generates what an fp32 cache holding the values the
    pairs stand for generates (first blocks at hi + lo, the rest at e4m3), token for token,
    through chunked prefill, prefix-cache hits and preemption (24 blocks of 4), scales not 1."""
    from test_engine import PROMPTS, encode_all

    ids = encode_all(tiny_model_dir, PROMPTS)
    ids += [ids[2] + [7, 8], ids[2] + [9]]  # share a cached prefix with prompt 2
    scales = {0: (0.5, 2.0), 1: (3.0, 0.25)}
    kw = dict(dtype="float32", device="cpu", block_size=4, num_blocks=24, max_batch_tokens=16)
    kw |= dict(output_reserve=0, prefix_cache=prefix_cache)  # preemption happens
    paired = LLM(str(tiny_model_dir), kv_cache_dtype="fp8", fp8_kv_pair_first_block=True, **kw)
    real_write = torch_backend.write_kv

    def rounded_write(k, v, k_cache, v_cache, slots, k_scale=1.0, v_scale=1.0):
        running = rounded.engine.scheduler.running  # the step's requests, as it writes
        firsts = torch.tensor([r.block_ids[0] for r in running if r.block_ids])
        first = torch.isin(slots // 4, firsts)[:, None, None]
        k = torch.where(first, pair_rounded(k, k_scale), dequantize(quantize(k, k_scale), k_scale))
        v = torch.where(first, pair_rounded(v, v_scale), dequantize(quantize(v, v_scale), v_scale))
        real_write(k, v, k_cache, v_cache, slots)

    monkeypatch.setattr(torch_backend, "write_kv", rounded_write)
    rounded = LLM(str(tiny_model_dir), **kw)  # its backend takes the write above
    for llm in (paired, rounded):
        for layer, (k_scale, v_scale) in scales.items():
            attention = llm.engine.runner.model.model.layers[layer].self_attn
            attention.k_scale, attention.v_scale = k_scale, v_scale
    out_paired, out_rounded = paired.generate(ids, greedy(30)), rounded.generate(ids, greedy(30))
    assert paired.engine.scheduler.num_preemptions > 0
    assert (paired.engine.scheduler.num_cached_tokens > 0) == prefix_cache
    assert [o.token_ids for o in out_paired] == [o.token_ids for o in out_rounded]
    blocks = paired.engine.scheduler.blocks
    partners = sum(p >= 0 for p in blocks.partner)
    assert len(blocks.free_ids) + partners == blocks.num_blocks, "or a cached block's partner"
    assert blocks.num_free == blocks.num_blocks
    table = paired.engine.runner.tables.partners[: blocks.num_blocks].tolist()
    for block, partner in blocks.take_partner_changes().items():  # what the next step sends
        table[block] = partner
    assert table == blocks.partner, "the device table follows the block manager"
