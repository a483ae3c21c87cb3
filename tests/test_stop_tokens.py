"""Stop strings cut the token columns where they cut the text, whatever the watcher's timing.

The rule (text/stop.py, kept_token_counts): an output cut at a stop string keeps the fewest
leading tokens whose decoded text starts with its cut text.
"""

from __future__ import annotations

import time

from test_pipeline import make_config, output, write_jsonl
from test_stop import a_stop_string_in, greedy

from bulkgen import LLM
from bulkgen.engine.token_logprobs import TokenLogprobs
from bulkgen.pipeline import run
from bulkgen.row import Row
from bulkgen.text.stage import Detokenize
from bulkgen.text.stop import StopWatcher, kept_token_counts

TEXT = "The quick brown fox jumps over the lazy dog. A paged KV cache stores keys and values."


def decoder(tokenizer):
    return Detokenize(tokenizer).decode


def test_a_stop_string_on_a_token_boundary_drops_its_token(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    decode = decoder(tiny_tokenizer)
    at = len(decode([ids[:6]])[0])  # the stop string begins with token 6
    assert kept_token_counts([ids], [TEXT[:at]], decode) == [6]
    assert decode([ids[:6]]) == [TEXT[:at]], "the kept tokens decode to the text"


def test_a_stop_string_inside_a_token_keeps_that_token(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    decode = decoder(tiny_tokenizer)
    j = next(j for j in range(3, len(ids)) if len(decode([ids[j : j + 1]])[0]) >= 3)
    at = len(decode([ids[:j]])[0]) + 1  # one character into token j
    assert kept_token_counts([ids], [TEXT[:at]], decode) == [j + 1]
    assert kept_token_counts([ids], [""], decode) == [0], "an empty text keeps no token"


def stopped_row(ids: list[int], stop: str) -> Row:
    row = Row(id="a", prompt="p", params=greedy(200, stop=[stop], logprobs=1), token_ids=ids)
    chosen = [-0.5 - i for i in range(len(ids))]
    row.token_logprobs = TokenLogprobs.from_pairs(
        chosen, [[(t, -0.5 - i)] for i, t in enumerate(ids)], 1
    )
    return row


def test_rows_are_the_same_however_many_tokens_follow_the_stop_string(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    stop, at = a_stop_string_in(TEXT, 20)
    decode = decoder(tiny_tokenizer)
    first = next(k for k in range(len(ids)) if len(decode([ids[:k]])[0]) >= at + len(stop))
    rows = [stopped_row(ids[: first + extra], stop) for extra in (0, 1, 4, len(ids) - first)]
    Detokenize(tiny_tokenizer)(rows)
    columns = ("text", "token_ids", "token_logprobs", "top_texts", "token_texts")
    columns += ("completion_tokens",)
    seen = [tuple(getattr(r, c) for c in columns) for r in rows]
    assert seen == [seen[0]] * len(rows)
    assert rows[0].text == TEXT[:at] and decode([rows[0].token_ids])[0].startswith(TEXT[:at])
    assert rows[0].completion_tokens < first, "the tokens of the stop string are cut"


def test_a_job_writes_the_same_rows_whatever_the_watchers_delay(
    tmp_path, tiny_model_dir, monkeypatch
):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "Hello"}])
    run(make_config(tmp_path, tiny_model_dir, [path], sampling=greedy(100), device="cpu"))
    stop, _ = a_stop_string_in(output(tmp_path / "out")[0]["text"])
    generated = []  # tokens the engine made for the row, before the cut
    import bulkgen.stages as stages

    finish = stages._finish
    monkeypatch.setattr(
        stages, "_finish", lambda row, out: generated.append(len(out.token_ids)) or finish(row, out)
    )
    scan = StopWatcher._scan
    rows = []
    for delay in (0.0, 0.5):
        monkeypatch.setattr(StopWatcher, "_scan", lambda w, g, d=delay: time.sleep(d) or scan(w, g))
        sampling = greedy(100, stop=[stop], logprobs=2)
        config = make_config(tmp_path, tiny_model_dir, [path], sampling=sampling, device="cpu",
                             overwrite=True)  # fmt: skip
        run(config)
        rows.append(output(tmp_path / "out")[0])
    assert rows[0] == rows[1]
    assert (
        rows[1]["finish_reason"] == "stop"
        and len(rows[1]["logprobs"]) == len(rows[1]["top_logprobs"]) == rows[1]["completion_tokens"]
    )
    assert generated[1] > rows[1]["completion_tokens"], "the late abort left tokens to cut"


def test_llm_generate_cuts_tokens_like_text_whatever_the_abort_timing(tiny_model_dir, monkeypatch):
    llm = LLM(str(tiny_model_dir), device="cpu")
    free = llm.generate(["Hello"], greedy(80, ignore_eos=True))[0]
    stop, at = a_stop_string_in(free.text)
    params = greedy(80, ignore_eos=True, stop=[stop], logprobs=1)
    early = llm.generate(["Hello"], params)[0]
    monkeypatch.setattr(LLM, "_end_at_stops", lambda self, stops, seen: None)  # never aborts
    late = llm.generate(["Hello"], params)[0]
    assert len(late.token_ids) < 80 and (early.text, early.finish_reason) == (
        free.text[:at],
        "stop",
    )
    assert (early.token_ids, early.logprobs, early.top_logprobs, early.text) == (
        late.token_ids, late.logprobs, late.top_logprobs, late.text
    )  # fmt: skip
    assert early.token_ids == free.token_ids[: len(early.token_ids)]
