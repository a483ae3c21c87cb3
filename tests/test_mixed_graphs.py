"""Steps with prefill through pieces around attention (EngineConfig.mixed_graphs): on the CPU the
pieces run eagerly through the same static buffers and padding as the CUDA graphs replay them."""

from __future__ import annotations

import pytest
import torch
from test_engine import PROMPTS, encode_all, hf_greedy

from bulkgen import LLM, SamplingParams
from bulkgen.config import EngineConfig
from bulkgen.engine.mixed_graphs import MixedGraphs, resolve_mixed_graphs, token_buckets


def test_buckets_are_multiples_of_the_step_up_to_the_step_budget():
    assert token_buckets(2048, 128) == list(range(128, 2049, 128))
    assert token_buckets(300, 128) == [128, 256, 300]
    assert token_buckets(100, 128) == [100]
    large = token_buckets(8192, 128)
    assert len(large) <= 24 and large[-1] == 8192 and all(b % 16 == 0 for b in large)
    assert large[:2] == [352, 704], "steps of ceil(8192 / 24) rounded up to 16 tokens"


def test_the_setting_is_checked():
    assert EngineConfig(model="-").mixed_graphs is None
    with pytest.raises(ValueError, match="mixed_graphs must be true, false or unset"):
        EngineConfig(model="-", mixed_graphs="yes")
    with pytest.raises(ValueError, match="mixed_graph_tokens must be a positive integer"):
        EngineConfig(model="-", mixed_graph_tokens=0)


def test_unset_means_on_for_one_cuda_device_with_graphs_only():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    unset = EngineConfig(model="-")
    assert resolve_mixed_graphs(unset, cuda) is True
    assert resolve_mixed_graphs(unset, cpu) is False, "on the CPU the pieces only run eagerly"
    assert resolve_mixed_graphs(EngineConfig(model="-", cuda_graphs=False), cuda) is False
    assert resolve_mixed_graphs(EngineConfig(model="-", tensor_parallel=2), cuda) is False
    for given in (True, False):
        assert resolve_mixed_graphs(EngineConfig(model="-", mixed_graphs=given), cpu) is given
        assert resolve_mixed_graphs(EngineConfig(model="-", mixed_graphs=given), cuda) is given


def test_a_cpu_engine_runs_prefill_eagerly_unless_asked(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), device="cpu", dtype="float32").engine
    assert engine.cfg.mixed_graphs is False and engine.runner.mixed_graphs is None


def test_a_padded_step_through_the_pieces_equals_the_forward(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), device="cpu", dtype="float32").engine
    runner = engine.runner
    pieces = MixedGraphs(runner.model, runner.kv, 64, 16, torch.device("cpu"), None)
    lengths = [1, 1, 1, 20]  # three decoding rows' tokens and a chunk: 23 tokens, bucket 32
    seq_lens = [9, 30, 4, 20]
    backend = runner.model.attention
    starts = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    tables = torch.arange(4 * 4, dtype=torch.int32).view(4, 4)
    # Sequence b's blocks are 4b..4b+3 (16 tokens each): its token at position p is slot 64b + p.
    positions = torch.cat([torch.arange(s - q, s) for q, s in zip(lengths, seq_lens, strict=True)])
    seq_of = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))
    slots = seq_of * 64 + positions
    meta = backend.metadata(slots, starts, torch.tensor(seq_lens, dtype=torch.int32),
                            tables, lengths, seq_lens)  # fmt: skip
    ids = torch.randint(5, 200, (23,))
    want = runner.model(ids, positions, meta, runner.kv)
    got = pieces.run(ids, positions, meta)
    assert got.shape == want.shape and torch.equal(got, want)
    assert pieces.steps == 1 and pieces.bucket_for(23) == 32
    assert (pieces.slots[23:32] == -1).all(), "padding tokens write no KV"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # plain, qkv bias, q/k norm
def test_the_engine_gives_transformers_greedy_tokens_with_pieces(tiny_models, arch):
    tiny_model_dir = tiny_models[arch]
    ids = encode_all(tiny_model_dir, PROMPTS)
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32", mixed_graphs=True,
              mixed_graph_tokens=16, max_batch_tokens=40)  # fmt: skip
    outs = llm.generate(ids, SamplingParams(max_tokens=12, temperature=0.0))
    assert [o.token_ids for o in outs] == hf_greedy(tiny_model_dir, ids, 12)
    stats = llm.engine.stats
    assert stats["mixed_graph_steps"] > 0, "the prefill and mixed steps went through the pieces"
    assert (
        LLM(str(tiny_model_dir), device="cpu", dtype="float32").engine.stats["mixed_graph_steps"]
        is None
    )


def test_the_warm_up_s_steps_are_not_counted(tiny_model_dir):
    from bulkgen.engine.warmup import warmup_plans

    engine = LLM(str(tiny_model_dir), device="cpu", dtype="float32", mixed_graphs=True).engine
    plans = warmup_plans(engine.cfg, 64, engine.scheduler.blocks.num_blocks)
    engine.runner.warm_up(plans[:1])  # the longest prefill: through the pieces
    assert engine.stats["mixed_graph_steps"] == 0


def test_an_int8_cache_gives_the_same_tokens_through_the_pieces(tiny_model_dir):
    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(device="cpu", dtype="float32", kv_cache_dtype="int8", max_batch_tokens=40)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    eager = LLM(str(tiny_model_dir), **kw).generate(ids, params)
    pieces = LLM(str(tiny_model_dir), mixed_graphs=True, mixed_graph_tokens=16, **kw)
    assert [o.token_ids for o in pieces.generate(ids, params)] == [o.token_ids for o in eager]
    assert pieces.engine.stats["mixed_graph_steps"] > 0


def test_two_tensor_parallel_ranks_run_the_pieces_with_the_tokens_of_one_process(tiny_model_dir):
    from test_tensor_parallel import greedy_tokens

    kw = dict(mixed_graphs=True, mixed_graph_tokens=16, max_batch_tokens=40)
    assert greedy_tokens(tiny_model_dir, tensor_parallel=2, **kw) == greedy_tokens(tiny_model_dir)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_steps_with_prefill_replay_pieces_with_the_eager_tokens(tiny_model_dir):
    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(device="cuda", dtype="float32", max_batch_tokens=40, mixed_graph_tokens=16)
    params = SamplingParams(max_tokens=24, temperature=0.0)
    pieces = LLM(str(tiny_model_dir), mixed_graphs=True, **kw)
    runner = pieces.engine.runner
    assert sorted(runner.mixed_graphs.graphs) == [16, 32, 40]
    assert runner.graphs.pool == runner.mixed_graphs.pool, "decode steps replay in the same pool"
    outs = pieces.generate(ids, params)
    assert [o.token_ids for o in outs] == hf_greedy(tiny_model_dir, ids, 24)
    assert pieces.engine.stats["mixed_graph_steps"] > 0


@pytest.mark.parametrize("flag,steps", [("--mixed-graphs", True), ("--no-mixed-graphs", False)])
def test_the_flag_reaches_the_engine(tmp_path, tiny_model_dir, flag, steps):
    import json

    from click.testing import CliRunner

    from bulkgen.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about {w}"}) + "\n" for w in "ab"))
    args = ["run", prompts, "--model", tiny_model_dir, "--out", tmp_path / "out", "--quiet"]
    args += ["--device", "cpu", "--max-tokens", "4", flag]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert (stats["mixed_graph_steps"] is not None and stats["mixed_graph_steps"] > 0) is steps
