"""The engine on CUDA: Triton attention and CUDA graphs against the CPU oracles (GPU only)."""

from __future__ import annotations

import time

import pytest
import torch

from bulkgen import LLM, SamplingParams
from bulkgen.config import EngineConfig
from bulkgen.engine.engine import Engine
from bulkgen.model.shapes import LLAMA3_8B

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_cuda_fp32_greedy_matches_transformers(tiny_models, arch):
    from test_engine import PROMPTS, encode_all, hf_greedy

    model_dir = tiny_models[arch]
    ids = encode_all(model_dir, PROMPTS)
    llm = LLM(str(model_dir), dtype="float32", device="cuda", block_size=16, max_num_seqs=16)
    assert llm.engine.runner.graphs is not None, "decode steps must replay CUDA graphs"
    outs = llm.generate(ids, SamplingParams(max_tokens=24, temperature=0.0))
    assert [o.token_ids for o in outs] == hf_greedy(model_dir, ids, 24)


def test_cuda_tiny_cache_preemption_matches_cpu(tiny_model_dir):
    from test_engine import PROMPTS, encode_all

    ids = encode_all(tiny_model_dir, PROMPTS)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    kw = dict(dtype="float32", block_size=16, num_blocks=12, max_batch_tokens=32, max_num_seqs=8,
              output_reserve=0.0)  # fmt: skip
    gpu = LLM(str(tiny_model_dir), device="cuda", **kw)
    cpu = LLM(str(tiny_model_dir), device="cpu", **kw)
    out_gpu, out_cpu = gpu.generate(ids, params), cpu.generate(ids, params)
    assert gpu.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in out_gpu] == [o.token_ids for o in out_cpu]


def test_seeded_sampling_on_cuda_matches_cpu(tiny_model_dir):
    from test_engine import PROMPTS

    params = [SamplingParams(max_tokens=16, temperature=0.9, seed=i) for i in range(8)]
    gpu = LLM(str(tiny_model_dir), device="cuda", dtype="float32").generate(PROMPTS[:8], params)
    cpu = LLM(str(tiny_model_dir), device="cpu", dtype="float32").generate(PROMPTS[:8], params)
    same = sum(a.token_ids == b.token_ids for a, b in zip(gpu, cpu, strict=True))
    assert same >= 6, "rounding may flip a rare near-tie, never most rows"


def test_async_and_sync_agree_on_llama3_8b_shape_bf16():
    # Prefix caching off: the second loop would reuse the first loop's KV and prefill less, and
    # bf16 GEMMs of other shapes round differently; what is compared here is the loop.
    cfg = EngineConfig(
        model="llama3-8b-dummy", load_format="dummy", max_model_len=4096, prefix_cache=False
    )
    engine = Engine(cfg, model_config=dict(LLAMA3_8B))
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(1000, 120000, (int(n),), generator=gen).tolist()
        for n in torch.randint(16, 512, (64,), generator=gen)
    ]
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    results = []
    for async_loop in (True, False):
        engine.async_loop = async_loop
        for i, p in enumerate(prompts):
            engine.add(f"{async_loop}-{i}", p, params)
        outs = {}
        while engine.has_unfinished():
            outs.update({o.request_id: o.token_ids for o in engine.step()})
        results.append([outs[f"{async_loop}-{i}"] for i in range(len(prompts))])
    assert all(len(t) == 64 for t in results[0])
    assert results[0] == results[1]


def test_cuda_stats_report_gpu_busy_and_decode_bandwidth(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cuda", dtype="float32")
    llm.generate(["Hello"] * 4, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    stats = llm.engine.stats
    assert stats["copy_bandwidth_gbs"] > 100
    # A tiny model reads a few MB a step: its efficiency is real but rounds to about 0.
    assert stats["decode_bandwidth_gbs"] > 0
    efficiency = stats["decode_bandwidth_gbs"] / stats["copy_bandwidth_gbs"]
    assert stats["decode_bandwidth_efficiency"] == pytest.approx(efficiency, abs=1e-3)
    assert "gpu_busy_pct" in stats  # NVML present on the GPU machine


def test_cuda_stats_time_the_gpu_idle_between_steps(tiny_model_dir, monkeypatch):
    """A host stall of 50 ms before one step leaves the GPU idle that long (a tiny model's step
    takes well under a millisecond): the events see it; the pause between two generate calls
    is not counted."""
    llm = LLM(str(tiny_model_dir), device="cuda", dtype="float32")
    schedule, calls = llm.engine.scheduler.schedule, []

    def late_schedule():
        calls.append(None)
        if len(calls) == 6:
            time.sleep(0.05)
        return schedule()

    monkeypatch.setattr(llm.engine.scheduler, "schedule", late_schedule)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    llm.generate(["Hello"] * 4, params)
    stats = llm.engine.stats
    assert 45 <= stats["gpu_step_gap_max_ms"] < 200
    assert stats["gpu_step_gaps_over_1ms"] >= 1
    assert stats["gpu_step_gaps_s"] < stats["gpu_steps_span_s"]
    assert 0 < stats["gpu_gapless_pct"] < 100
    assert stats["gpu_step_segments"] == 1
    assert 0 < stats["gpu_decode_ms_per_step_median"] and 0 < stats["gpu_mixed_steps_s"]
    steps_s = stats["gpu_decode_steps_s"] + stats["gpu_mixed_steps_s"] + stats["gpu_step_gaps_s"]
    assert steps_s == pytest.approx(stats["gpu_steps_span_s"], abs=2e-3)  # they fill the span
    time.sleep(0.3)
    llm.generate(["Hello"] * 4, params)
    again = llm.engine.stats
    assert again["gpu_step_segments"] == 2
    assert again["gpu_step_gap_max_ms"] < 200  # the 300 ms between the calls is not a gap


def test_every_sampling_setting_decodes_from_graphs_with_the_eager_outputs(tiny_model_dir):
    """Forward-only graphs: greedy, temperature, top-k/p, min-p and logprobs rows in one batch
    all replay graphs, and give what the same engine gives without graphs."""
    from test_engine import PROMPTS

    settings = [
        dict(temperature=0.0),
        dict(temperature=0.8),
        dict(temperature=0.8, top_p=0.9),
        dict(temperature=1.0, top_k=5),
        dict(temperature=1.0, min_p=0.1),
        dict(temperature=0.0, logprobs=3),
        dict(temperature=0.7, top_p=0.95, logprobs=0),
        dict(temperature=1.0, top_k=20, top_p=0.8, min_p=0.02),
        dict(temperature=0.0, repetition_penalty=1.3),
        dict(temperature=0.9, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.3),
    ]
    params = [SamplingParams(max_tokens=20, seed=i, ignore_eos=True, **s) for i, s in
              enumerate(settings)]  # fmt: skip
    runs = []
    for graphs in (True, False):
        llm = LLM(str(tiny_model_dir), device="cuda", dtype="float32", cuda_graphs=graphs)
        runs.append(llm.generate(PROMPTS[: len(params)], params))
        stats = llm.engine.stats
        if graphs:
            assert stats["eager_decode_steps"] == 0 and stats["decode_graph_steps"] > 0
    for a, b in zip(*runs, strict=True):
        assert a.token_ids == b.token_ids
        if a.logprobs is not None:
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_cuda_penalties_match_cpu(tiny_model_dir):
    from test_engine import PROMPTS

    params = [
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, repetition_penalty=1.4),
        SamplingParams(
            max_tokens=24,
            temperature=0.0,
            ignore_eos=True,
            presence_penalty=0.7,
            frequency_penalty=0.4,
        ),  # fmt: skip
    ] * 3
    gpu = LLM(str(tiny_model_dir), device="cuda", dtype="float32").generate(PROMPTS[:6], params)
    cpu = LLM(str(tiny_model_dir), device="cpu", dtype="float32").generate(PROMPTS[:6], params)
    same = sum(a.token_ids == b.token_ids for a, b in zip(gpu, cpu, strict=True))
    assert same >= 5, "rounding may flip a rare near-tie, never most rows"


def test_steps_replay_the_cheapest_measured_graph_and_padding_changes_no_token(tiny_model_dir):
    from test_engine import PROMPTS, encode_all, hf_greedy

    llm = LLM(str(tiny_model_dir), dtype="float32", device="cuda", max_num_seqs=64)
    graphs = llm.engine.runner.graphs
    stats = llm.engine.stats
    times = stats["graph_replay_ms"]
    assert list(times) == graphs.buckets and all(t > 0 for t in times.values())
    for b, s in stats["graph_buckets_replaced"].items():
        assert s > b and times[s] < 0.97 * times[b], "replaced only by a cheaper, larger graph"
    graphs.serve = [len(graphs.buckets) - 1] * len(graphs.buckets)  # every step: 64 rows
    ids = encode_all(tiny_model_dir, PROMPTS)
    outs = llm.generate(ids, SamplingParams(max_tokens=24, temperature=0.0))
    assert [o.token_ids for o in outs] == hf_greedy(tiny_model_dir, ids, 24)
    assert llm.engine.stats["eager_decode_steps"] == 0
