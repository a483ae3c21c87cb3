"""The Python API: stop strings and chat through LLM, like bulkgen run does them."""

from __future__ import annotations

import dataclasses

import pytest

from bulkgen import LLM, SamplingParams


def test_generate_cuts_at_a_stop_string_and_ends_early(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    free = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=60, temperature=0.0,
                                                                ignore_eos=True))[0]  # fmt: skip
    stop = free.text[len(free.text) // 3 : len(free.text) // 3 + 3]
    assert stop.strip() and free.text.index(stop) > 0
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True, stop=[stop])
    out = llm.generate(["The quick brown fox"], params)[0]
    assert out.text == free.text[: free.text.index(stop)]
    assert out.finish_reason == "stop"
    assert len(out.token_ids) < 60, "the request was aborted, not run to max_tokens"
    assert out.token_ids == free.token_ids[: len(out.token_ids)]


def test_chat_renders_the_template_like_transformers(tiny_model_dir, tiny_tokenizer):
    llm = LLM(str(tiny_model_dir), device="cpu")
    params = SamplingParams(max_tokens=8, temperature=0.0)
    conversation = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(conversation, params, system="Answer briefly.")[0]
    messages = [{"role": "system", "content": "Answer briefly."}, *conversation]
    ids = tiny_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert out.prompt_token_ids == ids
    assert out.token_ids == llm.generate([ids], params)[0].token_ids


def test_generate_n_gives_n_reproducible_completions_per_prompt(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    prompts = ["The quick brown fox", "Once upon a time"]
    outs = llm.generate(prompts, params, n=3)
    assert [o.sample for o in outs] == [0, 1, 2, 0, 1, 2]
    assert [o.prompt_token_ids for o in outs[:3]] == [outs[0].prompt_token_ids] * 3
    # Completion 0 is what n=1 gives; the others have seeds of their own, the same on a rerun.
    single = llm.generate(prompts, params)
    assert [outs[0].token_ids, outs[3].token_ids] == [o.token_ids for o in single]
    assert len({tuple(o.token_ids) for o in outs[:3]}) == 3
    assert [o.token_ids for o in llm.generate(prompts, params, n=3)] == [o.token_ids for o in outs]
    greedy = llm.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0), n=2)
    assert greedy[0].token_ids == greedy[1].token_ids


def test_generate_n_below_one_is_refused(tiny_model_dir):
    import pytest

    with pytest.raises(ValueError, match="n .completions per prompt. must be >= 1"):
        LLM(str(tiny_model_dir), device="cpu").generate(["Hi"], n=0)


def test_more_logprobs_than_the_vocabulary_is_refused(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(ValueError, match=f"logprobs {vocab + 1} is more than the model's vocab"):
        llm.generate(["Hi"], SamplingParams(max_tokens=2, logprobs=vocab + 1))
    out = llm.generate(["Hi"], SamplingParams(max_tokens=2, logprobs=vocab))[0]
    lp = out.token_logprobs
    assert lp.k == vocab and lp.top_ids.shape == (2 * vocab,)  # every token, at both positions


def test_a_stop_string_is_matched_on_text_without_special_tokens(tiny_model_dir, tiny_tokenizer):
    # A completion holding a special token whose text is the stop string: the text has no
    # special tokens, so it does not stop (the early check kept them and cut it short).
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32")
    special = {t: tiny_tokenizer.convert_ids_to_tokens(t) for t in tiny_tokenizer.all_special_ids}
    for seed in range(40):
        params = SamplingParams(max_tokens=30, temperature=1.5, seed=seed, ignore_eos=True)
        free = llm.generate(["Hello world"], params)[0]
        found = [special[t] for t in free.token_ids if t in special]
        if found and found[0] not in free.text:
            break
    else:
        pytest.skip("no sampled completion held a special token")
    out = llm.generate(["Hello world"], dataclasses.replace(params, stop=(found[0],)))
    assert (out[0].token_ids, out[0].text, out[0].finish_reason) == (
        free.token_ids,
        free.text,
        free.finish_reason,
    )


def test_a_call_that_raised_leaves_nothing_behind(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32")
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(["Bonjour", "Hello"], params)]
    step, calls = llm.engine.step, []

    def interrupted():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in a notebook, three steps into the call
        return step()

    llm.engine.step = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["The quick brown fox", "def add"], params)
    llm.engine.step = step
    assert not llm.engine.has_unfinished()
    assert [o.token_ids for o in llm.generate(["Bonjour", "Hello"], params)] == expected
    vocab = llm.engine.model_config.vocab_size
    for bad, words in (([vocab], "outside the model's vocabulary"), ([], "is empty")):
        with pytest.raises(ValueError, match=words):
            llm.generate([bad, "ok"], params)
        assert not llm.engine.has_unfinished()
    assert [o.token_ids for o in llm.generate(["Bonjour", "Hello"], params)] == expected


def test_calls_from_two_threads_each_get_their_own_outputs(tiny_model_dir):
    """Two threads calling generate on one LLM got each other's or wrong outputs (or a
    KeyError): calls now run one after the other."""
    import threading

    llm = LLM(str(tiny_model_dir), device="cpu")
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = {t: [f"The quick {t} {i}" for i in range(4)] for t in range(2)}
    alone = {t: [o.token_ids for o in llm.generate(p, greedy)] for t, p in prompts.items()}
    got = {}

    def work(t):
        got[t] = [o.token_ids for o in llm.generate(prompts[t], greedy)]

    threads = [threading.Thread(target=work, args=(t,)) for t in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert got == alone


def test_a_call_interrupted_before_its_kv_was_written_leaves_no_cached_block(tiny_model_dir):
    """A Ctrl-C inside a prefill's launch left blocks registered in the prefix cache (at plan
    time) whose KV was never written: every later call with that prompt reused them."""
    prompts = [("The quick brown fox jumps over the lazy dog. " * 4) + str(i) for i in range(4)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32")  # prefix cache on
    runner = llm.engine.runner
    launch = runner.launch

    def interrupted(plan):
        runner.launch = launch  # once: where a real Ctrl-C lands, in the step's forward
        raise KeyboardInterrupt

    runner.launch = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, greedy)
    got = [o.token_ids for o in llm.generate(prompts, greedy)]
    fresh = LLM(str(tiny_model_dir), device="cpu", dtype="float32", prefix_cache=False)
    assert got == [o.token_ids for o in fresh.generate(prompts, greedy)]


def test_values_of_the_wrong_type_are_a_value_error_before_any_request(tiny_model_dir):
    """Fractional token ids ran as if rounded down; SamplingParams took stop=[..., 5] (a
    TypeError mid-call), stop_token_ids="12" (as 1 and 2), ignore_eos="no" (truthy)."""
    llm = LLM(str(tiny_model_dir), device="cpu")
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    for ids in ([1.5, 2.0], [1, 2.7]):
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            llm.generate([ids], greedy)
    assert not llm.engine.has_unfinished()
    bad = [{"stop": ["END", 5]}, {"stop_token_ids": "12"}, {"stop_token_ids": [2.7]},
           {"ignore_eos": "no"}, {"presence_penalty": True},
           {"frequency_penalty": False}, {"json_schema": {"enum": {1, 2}}}, {"choice": 123},
           {"choice": {"a", "b"}}, {"json_schema": {"minimum": float("nan")}}]  # fmt: skip
    for kw in bad:
        with pytest.raises(ValueError):
            SamplingParams(**kw)
    assert SamplingParams(stop=None, stop_token_ids=None).stop == ()


def test_chat_joins_text_content_parts_as_bulkgen_run_does(tiny_model_dir, tiny_tokenizer):
    """OpenAI-style text parts were rendered as their Python repr."""
    llm = LLM(str(tiny_model_dir), device="cpu")
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
        }
    ]
    joined = [{"role": "user", "content": "Hello"}]
    assert (
        llm.chat(parts, greedy)[0].prompt_token_ids == llm.chat(joined, greedy)[0].prompt_token_ids
    )
    with pytest.raises(ValueError, match="no string content"):
        llm.chat([{"role": "user"}], greedy)


@pytest.mark.parametrize(
    "option, value",
    [("num_blocks", 2.5), ("max_batch_tokens", 100.5), ("max_model_len", 100.5),
     ("max_batch_tokens", True), ("num_blocks", "8"), ("kv_memory", "0.5")],
)  # fmt: skip
def test_engine_options_of_the_wrong_type_name_the_option(tiny_model_dir, option, value):
    """They failed deep inside torch (empty(): argument 'size'...) or in a bare comparison."""
    with pytest.raises(ValueError, match=option):
        LLM(str(tiny_model_dir), device="cpu", **{option: value})


def test_a_closed_llm_lets_its_engine_go_and_refuses_calls(tiny_model_dir):
    """`with LLM(...) as llm` closes it; close() drops the engine (its memory goes back once
    nothing holds it: on a GPU, before the next engine sizes its cache) and later calls raise
    instead of running on an ended engine; closing twice is fine."""
    import gc
    import weakref

    params = SamplingParams(max_tokens=4, temperature=0.0)
    with LLM(str(tiny_model_dir), dtype="float32", device="cpu") as llm:
        first = llm.generate([[1, 2, 3]], params)[0].token_ids
        engine = weakref.ref(llm.engine)
    assert llm.engine is None
    gc.collect()
    assert engine() is None  # nothing kept it
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate([[1, 2, 3]], params)
    with pytest.raises(RuntimeError, match="closed"):
        llm.chat([{"role": "user", "content": "hi"}], params)
    llm.close()
    assert llm.tokenizer is not None  # still there for decoding what the calls returned
    again = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    assert again.generate([[1, 2, 3]], params)[0].token_ids == first
    again.close()


def test_an_empty_text_prompt_is_refused_where_the_tokenizer_adds_a_bos(tiny_model_dir):
    """ "" encodes to [BOS] with Llama-3's or Mistral's tokenizer: it ran from BOS alone where
    README (and bulkgen run's error record) call an empty prompt an error."""
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    tokenizer = llm.tokenizer
    bos = type("WithBos", (), {"encode": lambda self, text: [1, *tokenizer.encode(text)]})()
    llm._tokenizer = bos
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        llm.generate(["hi", ""], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished()
    llm.close()


def test_a_max_model_len_past_the_models_positions_says_it_is_cut(tiny_model_dir, caplog):
    """It was cut to the model's positions without a word."""
    import json
    import logging

    limit = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    with caplog.at_level(logging.WARNING, logger="bulkgen.engine.model_files"):
        llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu", max_model_len=100_000)
    assert llm.engine.max_model_len == limit
    assert f"max_model_len 100000 is more than the model's {limit} positions" in caplog.text
    llm.close()


def test_close_from_another_thread_waits_for_the_call_running(tiny_model_dir):
    """close() took the engine away and only then waited: the generate() running in another
    thread met None mid-call (an AttributeError from its clean-up)."""
    import threading

    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    outs, errors = [], []

    def call():
        try:
            outs.extend(
                llm.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=64, ignore_eos=True))
            )
        except Exception as e:  # noqa: BLE001 - the failure under test
            errors.append(e)

    worker = threading.Thread(target=call)
    worker.start()
    while llm.engine is not None and not llm.engine.has_unfinished() and worker.is_alive():
        pass  # until the call has added its requests
    llm.close()
    worker.join()
    assert errors == [] and len(outs) == 4 and all(len(o.token_ids) == 64 for o in outs)
    assert llm.engine is None
