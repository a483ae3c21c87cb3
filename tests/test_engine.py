"""The engine's outputs against transformers' generate on the same weights (CPU, fp32)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bulkgen import LLM, SamplingParams

PROMPTS = [
    "The quick brown fox",
    "Hello",
    "A paged KV cache stores keys and values in fixed-size blocks. Continuous batching keeps",
    "What is the capital of France?",
    "def add(a, b):",
    "Numbers: 0 1 2 3",
    "Summarise the following text in one sentence, then list three keywords. Bonjour",
    "Write a haiku about the sea.",
    "x",
    "Explain photosynthesis to a child. The quick brown fox jumps over the lazy dog.",
]


def hf_greedy(model_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for ids in prompts:
        x = torch.tensor([ids])
        y = model.generate(x, max_new_tokens=max_new_tokens, do_sample=False)
        outs.append(y[0, len(ids) :].tolist())
    return outs


def encode_all(model_dir, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok.encode(p) for p in prompts]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_matches_transformers(tiny_models, arch):
    model_dir = tiny_models[arch]
    ids = encode_all(model_dir, PROMPTS)
    assert len({len(i) for i in ids}) >= 6, "prompts should have different lengths"
    llm = LLM(str(model_dir), dtype="float32", device="cpu")
    outs = llm.generate(ids, SamplingParams(max_tokens=24, temperature=0.0))
    ref = hf_greedy(model_dir, ids, 24)
    for out, expected in zip(outs, ref, strict=True):
        assert out.token_ids == expected
        assert out.finish_reason == ("length" if len(expected) == 24 else "stop")


@pytest.mark.parametrize("async_loop", [True, False])
def test_tiny_cache_chunks_and_preempts_but_output_is_unchanged(tiny_models, async_loop):
    model_dir = tiny_models["llama"]
    ids = encode_all(model_dir, PROMPTS)
    llm = LLM(
        str(model_dir),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=24,
        max_batch_tokens=16,
        max_num_seqs=8,
        output_reserve=0.0,  # no horizon: preemption makes the room
        async_loop=async_loop,
    )
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    outs = llm.generate(ids, params)
    assert max(len(i) for i in ids) > 16, "some prompt must need several prefill chunks"
    assert llm.engine.scheduler.num_preemptions > 0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for out, prompt in zip(outs, ids, strict=True):
        x = torch.tensor([prompt])
        y = model.generate(x, max_new_tokens=30, min_new_tokens=30, do_sample=False)
        assert out.token_ids == y[0, len(prompt) :].tolist()
        assert out.finish_reason == "length"
    assert llm.engine.scheduler.blocks.num_free == 24, "every block is returned"


def test_async_and_sync_loops_agree(tiny_model_dir):
    params = [
        SamplingParams(max_tokens=12, temperature=0.0),
        SamplingParams(max_tokens=7, temperature=0.8, seed=3),
        SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=4),
    ] * 3
    prompts = PROMPTS[: len(params)]
    a = LLM(str(tiny_model_dir), device="cpu", async_loop=True).generate(prompts, params)
    b = LLM(str(tiny_model_dir), device="cpu", async_loop=False).generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_seeded_sample_is_the_same_alone_and_in_a_batch(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    params = SamplingParams(max_tokens=16, temperature=1.0, top_k=50, top_p=0.95, seed=1234)
    alone = llm.generate([PROMPTS[0]], params)[0].token_ids
    others = [SamplingParams(max_tokens=10 + i, temperature=0.9, seed=i) for i in range(16)]
    batch = llm.generate(PROMPTS[1:] + PROMPTS[:7] + [PROMPTS[0]], others + [params])
    assert batch[-1].token_ids == alone
    again = llm.generate([PROMPTS[0]], params)[0].token_ids
    assert again == alone


def test_different_seeds_give_different_samples(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    outs = llm.generate(
        [PROMPTS[0]] * 4,
        [SamplingParams(max_tokens=16, temperature=1.0, seed=s, ignore_eos=True) for s in range(4)],
    )
    assert len({tuple(o.token_ids) for o in outs}) == 4


def test_top_k_1_equals_greedy(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    greedy = llm.generate(PROMPTS[:4], SamplingParams(max_tokens=16, temperature=0.0))
    top1 = llm.generate(PROMPTS[:4], SamplingParams(max_tokens=16, temperature=1.5, top_k=1))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in top1]


def test_max_tokens_ends_with_length(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    outs = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert all(len(o.token_ids) == 5 and o.finish_reason == "length" for o in outs)
    one = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=1, temperature=0.0))[0]
    assert len(one.token_ids) == 1 and one.finish_reason == "length"


def test_eos_from_generation_config_ends_with_stop(tiny_model_dir, tmp_path):
    probe = LLM(str(tiny_model_dir), device="cpu")
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    free = probe.generate([PROMPTS[0]], params)[0].token_ids
    eos = free[3]
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [999, eos]}))
    llm = LLM(str(model_dir), device="cpu")
    out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=20, temperature=0.0))[0]
    assert out.token_ids == free[: free.index(eos) + 1]
    assert out.finish_reason == "stop"
    ignoring = llm.generate([PROMPTS[0]], params)[0]
    assert ignoring.token_ids == free and ignoring.finish_reason == "length"


def test_stop_token_ids_end_with_stop(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    free = llm.generate([PROMPTS[2]], SamplingParams(max_tokens=12, temperature=0.0))[0]
    stop_at = free.token_ids[5]
    params = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_at])
    out = llm.generate([PROMPTS[2]], params)[0]
    assert out.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    assert out.finish_reason == "stop"


def test_overlong_prompt_fails_alone(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    too_long = list(range(10, 300)) * 2  # 580 tokens; the model's context is 512
    outs = llm.generate(
        [PROMPTS[0], too_long, PROMPTS[1]], SamplingParams(max_tokens=4, temperature=0.0)
    )
    assert outs[1].finish_reason == "error"
    assert "580 tokens" in outs[1].error and "512" in outs[1].error
    assert outs[0].finish_reason != "error" and len(outs[0].token_ids) > 0
    assert outs[2].finish_reason != "error" and len(outs[2].token_ids) > 0


def test_prompt_larger_than_the_whole_cache_fails_alone(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", block_size=4, num_blocks=8)
    outs = llm.generate([list(range(5, 45)), [5, 6, 7]], SamplingParams(max_tokens=3))
    assert outs[0].finish_reason == "error" and "KV cache" in outs[0].error
    assert len(outs[1].token_ids) == 3


def test_a_cache_smaller_than_the_context_is_the_context(tiny_model_dir):
    # 16 tokens of cache against the model's 512: a sequence ends at 16 tokens, "length", as at
    # the model's context (it preempted itself at the cache's end and was cut there unannounced).
    llm = LLM(str(tiny_model_dir), device="cpu", block_size=4, num_blocks=4)
    assert llm.engine.max_model_len == 16
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=50, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.prompt_token_ids + out.token_ids) == 16
    assert llm.engine.stats["preemptions"] == 0


def test_text_prompts_and_per_prompt_params(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    outs = llm.generate(
        ["Hello", "The quick"],
        [SamplingParams(max_tokens=3, temperature=0.0), SamplingParams(max_tokens=6)],
    )
    assert [len(o.token_ids) <= n for o, n in zip(outs, [3, 6], strict=True)] == [True, True]
    assert outs[0].text == llm.tokenizer.decode(outs[0].token_ids, skip_special_tokens=True)


def test_unsupported_architecture_is_a_clear_error(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "gpt2"
    shutil.copytree(tiny_model_dir, model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        LLM(str(model_dir), device="cpu")


def test_progress_of_stop_string_requests_is_streamed_and_abort_ends_them(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    engine = llm.engine
    engine.add("watched", [5, 6, 7], SamplingParams(max_tokens=40, ignore_eos=True, stop=["zz"]))
    engine.add("plain", [5, 6, 7], SamplingParams(max_tokens=40, ignore_eos=True))
    seen: list[int] = []
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            finished[out.request_id] = out
        for request_id, tokens in engine.take_progress():
            assert request_id == "watched"
            seen += tokens
            if len(seen) >= 5 and "watched" not in finished:
                engine.abort("watched")
    assert finished["watched"].finish_reason == "stop"
    assert 5 <= len(finished["watched"].token_ids) < 40
    assert finished["watched"].token_ids == seen[: len(finished["watched"].token_ids)]
    assert len(finished["plain"].token_ids) == 40


def test_stats_report_host_time_per_step(tiny_model_dir):
    from bulkgen import LLM

    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    llm.generate(["Hello there"] * 3, SamplingParams(max_tokens=8, temperature=0.0))
    stats = llm.engine.stats
    assert 0 < stats["host_ms_per_step_median"] <= stats["host_ms_per_step_p99"]
    assert stats["host_ms_per_step_p99"] <= stats["host_ms_per_step_max"]
    total = list(llm.engine.host_times.total)
    assert stats["host_ms_per_step_max"] == round(1e3 * max(total), 3)
    assert total[stats["host_max_step"]] == max(total)
    assert stats["decode_graph_steps"] == 0 and stats["eager_decode_steps"] > 0  # no graphs on CPU
    # Split by kind (the first step prefills, the rest decode) and by phase, which add up.
    times = llm.engine.host_times
    kinds, phases = times.kind, times.phase
    assert len(kinds["mixed"]) == 1 and len(kinds["decode"]) == len(times.total) - 1 >= 7
    for i, total in enumerate(times.total):
        assert sum(phases[p][i] for p in ("schedule", "launch", "update")) == pytest.approx(total)
    for name in ("host_decode", "host_mixed", "host_schedule", "host_launch", "host_update"):
        assert 0 <= stats[f"{name}_ms_per_step_median"] <= stats[f"{name}_ms_per_step_p99"]
    assert list(times.launch["mixed"]) == [phases["launch"][0]], "the prefill step's launch"
    assert list(times.launch["decode"]) == list(phases["launch"][1:])
    # The launch on the engine thread's CPU clock: one value a step, by kind; on the CPU the
    # forward's work is partly on torch's own threads, so it is below the wall time, not zero.
    cpu = times.launch_cpu
    assert len(cpu["mixed"]) == 1 and len(cpu["decode"]) == len(times.launch["decode"])
    assert all(0 < c for c in [*cpu["mixed"], *cpu["decode"]])
    for kind in ("decode", "mixed"):
        assert 0 < stats[f"host_{kind}_launch_cpu_ms_per_step_median"]
    assert stats["host_mixed_launch_ms_per_step_median"] == round(1e3 * phases["launch"][0], 3)
    assert stats["alloc_retries"] is None and stats["device_mallocs"] is None  # CPU: not kept
    assert len(stats["gc_collections"]) == 3 and stats["gc_pause_s"] >= 0  # kept on the CPU too


def test_recomputed_tokens_count_what_preemption_made_the_engine_compute_again(tiny_model_dir):
    from bulkgen import LLM

    ids = encode_all(tiny_model_dir, PROMPTS)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    roomy = LLM(str(tiny_model_dir), dtype="float32", device="cpu", prefix_cache=False)
    roomy.generate(ids, params)
    assert roomy.engine.stats["recomputed_tokens"] == 0
    tight = LLM(str(tiny_model_dir), dtype="float32", device="cpu", block_size=16, num_blocks=12,
                max_batch_tokens=32, max_num_seqs=8, prefix_cache=False,
                output_reserve=0.0)  # fmt: skip
    scheduler = tight.engine.scheduler
    computed, requests = [0], set()
    original = scheduler._scheduled

    def counting(req, n, num_tokens=None):
        computed[0] += n
        requests.add(req)
        return original(req, n, num_tokens)

    scheduler._scheduled = counting
    tight.generate(ids, params)
    stats = tight.engine.stats
    assert stats["preemptions"] > 0 and stats["recomputed_tokens"] > 0
    # Everything computed beyond each position's first computation is recomputed work.
    assert stats["recomputed_tokens"] == computed[0] - sum(r.max_computed for r in requests)
