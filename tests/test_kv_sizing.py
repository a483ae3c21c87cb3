"""What the KV cache's sizing sets aside (engine/kv_sizing.py): the graphs' pools are measured on
forwards that compute no logits, since the graphs capture none and every step's logits come out
of the activations already counted; stats.json says what was set aside."""

from __future__ import annotations

import pytest
import torch

from bulkgen import LLM
from bulkgen.config import EngineConfig
from bulkgen.engine import kv_sizing
from bulkgen.engine.kv_sizing import KvSizing, forward_bytes
from bulkgen.engine.runner import ModelRunner, kv_bytes_per_block
from bulkgen.engine.warmup import fullest_step, warmup_blocks, widest_decode

CPU = torch.device("cpu")


@pytest.mark.parametrize("max_num_seqs", [8, 512, "auto"])
def test_the_widest_decode_probe_has_every_graph_row_and_samples_none(max_num_seqs):
    cfg = EngineConfig(model="m", max_num_seqs=max_num_seqs, block_size=16)
    plan = widest_decode(cfg, sample=False)
    assert len(plan.seqs) == cfg.graph_rows and plan.decode_only
    assert plan.sampled == []
    assert len(widest_decode(cfg).sampled) == cfg.graph_rows  # the warm-up's own plan samples


@pytest.mark.parametrize("max_model_len", [100, 4096, 9000])
def test_the_fullest_step_fills_the_token_budget_with_prompts_the_model_takes(max_model_len):
    cfg = EngineConfig(model="m", max_batch_tokens=8192, block_size=16)
    plan = fullest_step(cfg, max_model_len, sample=False)  # no cache to wrap around
    assert plan.num_tokens == 8192 and len(plan.seqs) <= cfg.seq_rows
    assert max(s.num_tokens for s in plan.seqs) <= max_model_len - 1
    assert plan.sampled == []
    ids = [b for s in plan.seqs for b in s.request.block_ids]
    assert len(ids) == len(set(ids)), "each prompt writes blocks of its own"


def test_the_fullest_step_never_has_more_prompts_than_the_tables_have_rows():
    """16 rows of 511 tokens hold 8,176 of 8,192: the step a run could make (a 17th prompt's row
    would index past the probe's tables, a device-side assert on the GPU)."""
    cfg = EngineConfig(model="m", max_num_seqs=16, max_batch_tokens=8192, block_size=16)
    plan = fullest_step(cfg, 512)
    assert len(plan.seqs) == 16 and plan.num_tokens == 16 * 511
    assert max(s.request.table_row for s in plan.seqs) == 15


def test_the_pool_probes_run_the_forward_and_never_the_logits(tiny_model_dir, monkeypatch):
    """The probes' forwards through the runner stop at the hidden state, as the graphs do: a
    logits call would fail here. The warm-up's own widest decode does compute them."""
    # 2,048 tokens a step: the fullest step's four prompts of 511 tokens need more blocks than
    # the warm-up plans give the probe (which the torch backend's writes would index past)
    kw = dict(device="cpu", dtype="float32", block_size=16, max_num_seqs=8, max_batch_tokens=2048)
    engine = LLM(str(tiny_model_dir), **kw).engine
    model, n, cfg = engine.runner.model, engine.max_model_len, engine.cfg
    blocks = warmup_blocks(cfg, n)
    assert fullest_step(cfg, n).num_tokens == 2048 and len(fullest_step(cfg, n).seqs) == 5
    probe = ModelRunner(model, model.cfg, cfg, CPU, blocks, n, graphs=False)
    calls = []
    real = model.compute_logits
    monkeypatch.setattr(model, "compute_logits", lambda *a, **k: calls.append(1) or real(*a, **k))
    for plan in (widest_decode(cfg, blocks, False), fullest_step(cfg, n, blocks, False)):
        assert max(b for s in plan.seqs for b in s.request.block_ids) < blocks
        probe.sample(probe.forward(plan)).wait()
    assert calls == []
    probe.sample(probe.forward(widest_decode(engine.cfg))).wait()
    assert calls == [1]


def test_forward_bytes_refuses_a_plan_that_samples():
    cfg = EngineConfig(model="m", max_num_seqs=4, block_size=16)
    with pytest.raises(AssertionError, match="logits"):
        forward_bytes(None, widest_decode(cfg), CPU)


def test_given_blocks_or_the_cpu_budget_measure_nothing(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(kv_sizing, "CPU_KV_BUDGET", 1 << 20)
    given = LLM(str(tiny_model_dir), device="cpu", dtype="float32", num_blocks=7).engine
    assert given.kv_sizing == KvSizing(7) and given.stats["kv_blocks"] == 7
    assert given.stats["kv_sizing_gb"] is None
    budget = LLM(str(tiny_model_dir), device="cpu", dtype="float32", block_size=16).engine
    assert budget.stats["kv_sizing_gb"] is None
    assert budget.kv_sizing.blocks == (1 << 20) // kv_bytes_per_block(
        budget.runner.model.cfg, 16, torch.float32
    )


def test_stats_report_each_reservation_in_gb():
    sizing = KvSizing(10, free=80e9, activations=1.25e9, decode_graphs=0.5e9, mixed_graphs=2e9,
                      decode_outputs=8e6, headroom=2 << 30)  # fmt: skip
    assert sizing.stats == {
        "kv_sizing_gb": {
            "free": 80.0,
            "activations": 1.25,
            "decode_graphs": 0.5,
            "mixed_graphs": 2.0,
            "graph_pool": 2.0,
            "decode_outputs": 0.008,
            "headroom": 2.147,
        }
    }


@pytest.mark.parametrize("decode,mixed", [(0.5e9, 2e9), (3e9, 2e9), (0.5e9, 0)])
def test_the_graphs_one_pool_sets_aside_the_larger_forward_not_the_sum(decode, mixed):
    sizing = KvSizing(10, free=80e9, activations=1e9, decode_graphs=decode, mixed_graphs=mixed,
                      decode_outputs=8e6, headroom=2e9)  # fmt: skip
    assert sizing.set_aside == 1e9 + max(decode, mixed) + 8e6 + 2e9


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_pool_leaves_out_the_widest_steps_float32_logits(tiny_model_dir):
    """On CUDA the decode pool measured without logits is smaller than the forward with them;
    stats.json carries the measured reservations."""
    llm = LLM(str(tiny_model_dir), device="cuda", dtype="bfloat16", max_num_seqs=512)
    engine = llm.engine
    sizing = engine.stats["kv_sizing_gb"]
    assert sizing["decode_graphs"] > 0 and sizing["mixed_graphs"] > 0 and sizing["free"] > 0
    model, n, cfg = engine.runner.model, engine.max_model_len, engine.cfg
    device = engine.device
    blocks = warmup_blocks(cfg, n)
    probe = ModelRunner(model, model.cfg, cfg, device, blocks, n, graphs=False)
    for sample in (True, False):  # the probe's own buffers, made at its first steps, as
        probe.sample(probe.forward(widest_decode(cfg, blocks, sample))).wait()  # the warm-up does
    without = forward_bytes(probe, widest_decode(cfg, blocks, sample=False), device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    forward = probe.forward(widest_decode(cfg, blocks))
    torch.cuda.synchronize(device)
    with_logits = torch.cuda.max_memory_allocated(device) - before
    probe.sample(forward).wait()
    # Only less: on a model this small the forward's own intermediates, freed before the
    # logits are made, can set both peaks (at the 8B shape the logits are most of it: 0.79 GB)
    assert without < with_logits


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_graphs_and_pieces_share_a_pool_that_keeps_no_tensor_between_steps(tiny_model_dir):
    """One pool for both graph kinds, and every block of it free once they are captured: no
    graph keeps its output there (graphs.py copies it to a static buffer), so the pool is the
    larger forward's, which is what the sizing sets aside."""
    llm = LLM(str(tiny_model_dir), device="cuda", dtype="bfloat16", max_num_seqs=512)
    runner, sizing = llm.engine.runner, llm.engine.stats["kv_sizing_gb"]
    assert runner.graphs.pool == runner.mixed_graphs.pool
    assert sizing["graph_pool"] == max(sizing["decode_graphs"], sizing["mixed_graphs"])
    pool = tuple(runner.graphs.pool)
    segments = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pool]
    assert segments, "the captures allocated in the shared pool"
    assert all(b["state"] == "inactive" for s in segments for b in s["blocks"])
