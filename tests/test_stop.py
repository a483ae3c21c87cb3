"""Stop strings: cut out of the text, finish_reason stop, and found early off the engine thread."""

from __future__ import annotations

import json
import threading

from test_cli import bulkgen
from test_pipeline import factory, make_config, output, write_jsonl

from bulkgen.config import SamplingParams
from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.pipeline import run
from bulkgen.text.stage import Detokenize
from bulkgen.text.stop import StopWatcher, cut_at_stop

LONG = 100


def greedy(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def a_stop_string_in(text: str, start: int = 12) -> tuple[str, int]:
    """A 3-character stop string first found at or after start, and where."""
    for i in range(start, len(text) - 3):
        piece = text[i : i + 3]
        if piece.isascii() and piece.isprintable() and text.find(piece) == i:
            return piece, i
    raise AssertionError(f"no usable stop string in {text!r}")


def test_the_earliest_stop_string_and_what_follows_are_cut():
    assert cut_at_stop("one two three", ("three", "two")) == "one "
    assert cut_at_stop("one two", ("four",)) is None
    assert cut_at_stop("xy", ("", "y")) == "x"


def test_a_stop_string_ends_the_request_early_on_the_real_engine(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "Hello"}])
    config = make_config(tmp_path, tiny_model_dir, [path], sampling=greedy(LONG), device="cpu")
    run(config)
    free = output(tmp_path / "out")[0]
    assert free["completion_tokens"] > 40, "the tiny model must talk for a while"
    stop, at = a_stop_string_in(free["text"])

    config = make_config(tmp_path, tiny_model_dir, [path], sampling=greedy(LONG, stop=[stop]),
                         device="cpu", overwrite=True)  # fmt: skip
    run(config)
    row = output(tmp_path / "out")[0]
    assert row["text"] == free["text"][:at]
    assert row["finish_reason"] == "stop"
    # The watcher aborted it soon after the stop string, not at max_tokens.
    assert row["completion_tokens"] < LONG


def test_a_rows_stop_column_overrides_the_flag(tmp_path, tiny_model_dir):
    records = [{"id": "plain", "prompt": "Hello"}, {"id": "own", "prompt": "Hello"}]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    config = make_config(tmp_path, tiny_model_dir, [path], sampling=greedy(60), device="cpu")
    run(config)
    free = output(tmp_path / "out")[0]["text"]
    first, at_first = a_stop_string_in(free, 5)
    second, at_second = a_stop_string_in(free, at_first + 10)
    records[1]["stop"] = [second]
    write_jsonl(path, records)
    config = make_config(tmp_path, tiny_model_dir, [path], sampling=greedy(60, stop=[first]),
                         device="cpu", overwrite=True)  # fmt: skip
    run(config)
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["plain"]["text"] == free[:at_first]
    assert rows["own"]["text"] == free[:at_second]
    assert rows["plain"]["finish_reason"] == rows["own"]["finish_reason"] == "stop"


def test_the_final_cut_needs_no_watcher(tmp_path, tiny_model_dir, tiny_tokenizer):
    """The FakeEngine streams no progress: the detokenizer's cut alone is authoritative."""
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "The quick brown fox"}])
    run(make_config(tmp_path, tiny_model_dir, [path], chat_template=False), factory())
    free = output(tmp_path / "out")[0]
    stop, at = a_stop_string_in(free["text"], 3)
    config = make_config(tmp_path, tiny_model_dir, [path], chat_template=False, overwrite=True,
                         sampling=greedy(50, stop=[stop]))  # fmt: skip
    run(config, factory())
    row = output(tmp_path / "out")[0]
    assert (row["text"], row["finish_reason"]) == (free["text"][:at], "stop")
    assert row["completion_tokens"] < free["completion_tokens"], "the tokens are cut too"


def test_stop_flags_reach_the_job(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hello"}])
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q",
                     "--stop-token-id", "5", "--stop-token-id", "7", "--stop", "a",
                     "--stop", "bc")  # fmt: skip
    assert result.exit_code == 0, result.output
    sampling = json.loads((tmp_path / "out" / "job.json").read_text())["settings"]["sampling"]
    assert (sampling["stop_token_ids"], sampling["stop"]) == ([5, 7], ["a", "bc"])


def watch(tokenizer, requests: dict[str, tuple[str, tuple[str, ...]]]) -> set[str]:
    """Feed each request's text to a StopWatcher one token a step; the ids it aborts."""
    stop = threading.Event()
    watcher = StopWatcher(Detokenize(tokenizer).decode, stop)
    thread = threading.Thread(target=watcher.run)
    thread.start()
    ids = {rid: tokenizer(text, add_special_tokens=False)["input_ids"] for rid, (text, _) in
           requests.items()}  # fmt: skip
    for rid, (_, stops) in requests.items():
        watcher.watch(rid, stops)
    for step in range(max(map(len, ids.values()))):
        progress = [(rid, toks[step : step + 1]) for rid, toks in ids.items() if step < len(toks)]
        watcher.send(progress, [])
    watcher.close()
    thread.join(10)
    return set(watcher.take_aborts())


def test_the_watcher_finds_stop_strings_split_over_tokens_and_characters(tiny_tokenizer):
    requests = {
        "ascii": ("The quick brown fox jumps over the lazy dog.", ("lazy",)),
        # ü and é are two bytes each: byte-level tokens can split them.
        "bytes": ("Très bien, merci. ¿Qué tal? Gut, danke.", ("Qué",)),
        "absent": ("The quick brown fox jumps over the lazy dog.", ("cat",)),
        "late": ("A paged KV cache stores keys and values in fixed-size blocks.", ("blocks",)),
    }
    assert watch(tiny_tokenizer, requests) == {"ascii", "bytes", "late"}
