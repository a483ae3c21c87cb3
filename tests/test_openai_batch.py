"""OpenAI Batch files: batch input lines are recognised; --format openai writes batch output."""

from __future__ import annotations

import json

import pytest
from test_pipeline import RecordingEngine, factory, make_config, output, write_jsonl

from bulkgen.config import SamplingParams
from bulkgen.engine.token_logprobs import TokenLogprobs
from bulkgen.io.openai import output_line
from bulkgen.pipeline import run
from bulkgen.row import Row
from bulkgen.text.stage import Detokenize

# Input lines exactly as the Batch API documents them.
BATCH = [
    {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-3.5-turbo-0125", "messages": [
         {"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Hello world!"}], "max_tokens": 5}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-3.5-turbo-0125", "messages": [
         {"role": "user", "content": "What is the capital of France?"}],
         "max_completion_tokens": 4, "n": 2, "temperature": 0.8, "seed": 3,
         "logprobs": True, "top_logprobs": 2}},
    {"custom_id": "request-3", "method": "POST", "url": "/v1/completions",
     "body": {"model": "gpt-3.5-turbo-instruct", "prompt": "The quick brown fox",
              "max_tokens": 3, "stop": ["\n"]}},
]  # fmt: skip


def read_batch_output(folder) -> dict[str, dict]:
    """How existing tooling reads Batch API results: one JSON object per line, by custom_id."""
    results = {}
    for path in sorted(folder.glob("part-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            results[record["custom_id"]] = record
    return results


def test_a_batch_file_round_trips(tmp_path, tiny_model_dir, tiny_tokenizer):
    path = write_jsonl(tmp_path / "batch.jsonl", BATCH)
    config = make_config(tmp_path, tiny_model_dir, [path], format="openai", device="cpu")
    run(config)
    results = read_batch_output(tmp_path / "out")
    assert sorted(results) == ["request-1", "request-2", "request-3"]
    for record in results.values():
        assert record["id"].startswith("batch_req_") and record["error"] is None
        assert record["response"]["status_code"] == 200
    chat = results["request-1"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["model"] == str(tiny_model_dir)
    [choice] = chat["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    ids = tiny_tokenizer.apply_chat_template(BATCH[0]["body"]["messages"], tokenize=True,
                                             add_generation_prompt=True)["input_ids"]  # fmt: skip
    usage = chat["usage"]
    assert usage["prompt_tokens"] == len(ids)
    assert 0 < usage["completion_tokens"] <= 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    sampled = results["request-2"]["response"]["body"]
    assert [c["index"] for c in sampled["choices"]] == [0, 1]
    assert sampled["usage"]["completion_tokens"] <= 2 * 4
    for c in sampled["choices"]:
        content = c["logprobs"]["content"]
        assert len(content) >= 1 and all(len(t["top_logprobs"]) == 2 for t in content)
        assert all(t["logprob"] <= 0 for t in content)  # bytes: its own (test_token_bytes)
        assert all(bytes(t["bytes"]).decode(errors="replace") == t["token"] for t in content)

    text = results["request-3"]["response"]["body"]
    assert text["object"] == "text_completion" and "\n" not in text["choices"][0]["text"]


def test_batch_output_holds_what_a_plain_run_generates(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "batch.jsonl", BATCH)
    run(make_config(tmp_path, tiny_model_dir, [path], format="jsonl", device="cpu"))
    plain = {(r["id"], r["sample"]): r for r in output(tmp_path / "out")}
    run(make_config(tmp_path, tiny_model_dir, [path], format="openai", device="cpu",
                    overwrite=True))  # fmt: skip
    results = read_batch_output(tmp_path / "out")
    for (custom_id, sample), row in plain.items():
        choice = results[custom_id]["response"]["body"]["choices"][sample]
        assert choice.get("message", {}).get("content", choice.get("text")) == row["text"]
        assert choice["finish_reason"] == row["finish_reason"]


def test_batch_fields_become_row_parameters(tmp_path, tiny_model_dir, tiny_tokenizer):
    path = write_jsonl(tmp_path / "batch.jsonl", BATCH)
    run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    params = [p for _, p in RecordingEngine.instances[0].added.values()]
    prompts = [ids for ids, _ in RecordingEngine.instances[0].added.values()]
    # A completions request is a raw text completion: no chat template around its prompt.
    assert prompts[3] == tiny_tokenizer("The quick brown fox")["input_ids"]
    assert params[0].max_tokens == 5 and params[0].greedy
    two = params[1:3]  # request-2's n=2 samples
    assert [(p.max_tokens, p.temperature, p.logprobs) for p in two] == [(4, 0.8, 2)] * 2
    assert two[0].seed == 3 and two[1].seed != 3
    assert (params[3].max_tokens, params[3].stop) == (3, ("\n",))
    rows = {(r["id"], r["sample"]) for r in output(tmp_path / "out")}
    assert rows == {("request-1", 0), ("request-2", 0), ("request-2", 1), ("request-3", 0)}


def test_a_bad_request_gets_an_error_line(tmp_path, tiny_model_dir):
    lines = [
        BATCH[0],
        {"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        {"custom_id": "bad-messages", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": "hello"}},
        {"custom_id": "bad-n", "url": "/v1/chat/completions",
         "body": {"messages": BATCH[0]["body"]["messages"], "n": 0}},
        {"prompt": "a plain row in a batch file"},
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "batch.jsonl", lines)
    stats = run(make_config(tmp_path, tiny_model_dir, [path], format="openai"), factory())
    results = read_batch_output(tmp_path / "out")
    assert results["request-1"]["error"] is None
    for custom_id, words in [("embed", "/v1/embeddings"), ("bad-messages", "messages"),
                             ("bad-n", "'n'"), ("batch:4", "custom_id")]:  # fmt: skip
        record = results[custom_id]
        assert record["response"] is None and record["error"]["code"] == "invalid_request"
        assert words in record["error"]["message"]
    assert stats["errors"] == 4


@pytest.mark.parametrize("bad", [{"bdy": {}}, {"body": {"messages": "hi"}, "custom_id": None}])
def test_a_malformed_first_request_is_its_error_line_not_the_files_kind(
    tmp_path, tiny_model_dir, bad
):
    first = {"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", **bad}
    if "bdy" in bad:
        del first["custom_id"]
    path = write_jsonl(tmp_path / "batch.jsonl", [first, *BATCH])
    stats = run(make_config(tmp_path, tiny_model_dir, [path], format="openai"), factory())
    results = read_batch_output(tmp_path / "out")
    assert [results[r["custom_id"]]["error"] for r in BATCH] == [None] * 3
    assert results["batch:0"]["response"] is None
    assert stats["errors"] == 1


def test_an_interrupted_openai_job_resumes_whole_requests(tmp_path, tiny_model_dir):
    records = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                "body": {"prompt": f"p {i}", "n": 3}} for i in range(200)]  # fmt: skip
    path = write_jsonl(tmp_path / "batch.jsonl", records)
    sampling = SamplingParams(temperature=0.5, max_tokens=4)
    config = make_config(tmp_path, tiny_model_dir, [path], format="openai", shard_size=4,
                         max_num_seqs=8, sampling=sampling)  # fmt: skip
    with pytest.raises(RuntimeError, match="failed on purpose"):
        run(config, factory(steps=1, fail_after_steps=60, step_delay=0.003))
    first = read_batch_output(tmp_path / "out")
    assert 0 < len(first) < 200
    run(config, factory(steps=1))
    lines = [json.loads(line) for p in sorted((tmp_path / "out").glob("part-*.jsonl"))
             for line in p.read_text().splitlines()]  # fmt: skip
    assert sorted(r["custom_id"] for r in lines) == sorted(f"r{i}" for i in range(200))
    for record in lines:
        assert [c["index"] for c in record["response"]["body"]["choices"]] == [0, 1, 2]
    # Only the requests with no line were generated again, all three samples of each.
    assert len(RecordingEngine.instances[0].added) == 3 * (200 - len(first))


def test_openai_results_are_scored_against_references_by_custom_id(tmp_path, tiny_model_dir):
    from bulkgen.score import extract_phrase, is_correct, score_folder

    path = write_jsonl(tmp_path / "batch.jsonl", BATCH)
    run(make_config(tmp_path, tiny_model_dir, [path], format="openai", device="cpu"))
    results = read_batch_output(tmp_path / "out")

    def texts(custom_id):
        choices = results[custom_id]["response"]["body"]["choices"]
        return [c["message"]["content"] if "message" in c else c["text"] for c in choices]

    # The eval set: request-1's reference is its own answer, request-3's one it never gives.
    answers = {"request-1": extract_phrase(texts("request-1")[0]) or "x",
               "request-2": extract_phrase(texts("request-2")[0]) or "x",
               "request-3": "zzz never said"}  # fmt: skip
    write_jsonl(
        tmp_path / "eval.jsonl", [{"custom_id": k, "answer": v} for k, v in answers.items()]
    )
    section = score_folder(tmp_path / "out", references=tmp_path / "eval.jsonl")
    items = [(k, t) for k in answers for t in texts(k)]  # request-2 has n=2: two items
    assert section["n"] == len(items) == 4
    assert section["correct"] == sum(is_correct(t, answers[k]) for k, t in items)
    assert section["correct"] > 0  # these seeded texts have a first clause to match


def test_an_openai_error_line_is_a_wrong_item_and_foreign_references_are_refused(tmp_path):
    from bulkgen.errors import UserError
    from bulkgen.score import score_folder

    out = tmp_path / "out"
    out.mkdir()
    lines = [
        {"id": "batch_req_1", "custom_id": "q1", "response": None,
         "error": {"code": "invalid_request", "message": "bad row"}},
        {"id": "batch_req_2", "custom_id": "q2", "error": None, "response": {
            "status_code": 200, "body": {"choices": [
                {"index": 0, "text": "The answer is 4", "finish_reason": "stop"}]}}},
    ]  # fmt: skip
    write_jsonl(out / "part-00000.jsonl", lines)
    write_jsonl(tmp_path / "eval.jsonl", [{"id": "q1", "answer": "3"}, {"id": "q2", "answer": "4"}])
    section = score_folder(out, references=tmp_path / "eval.jsonl")
    assert (section["n"], section["correct"]) == (2, 1)
    # With --n 2 an error line stands for both samples, as a Parquet shard's two error records
    # do (found by fuzzing: it counted once, so the formats gave other n and accuracy).
    (out / "job.json").write_text(json.dumps({"settings": {"n": 2}}))
    section = score_folder(out, references=tmp_path / "eval.jsonl")
    assert (section["n"], section["correct"]) == (3, 1)
    write_jsonl(tmp_path / "other.jsonl", [{"id": "x9", "answer": "4"}])
    with pytest.raises(UserError, match="none of the ids"):
        score_folder(out, references=tmp_path / "other.jsonl")


def named_row(tokenizer, api: str) -> Row:
    row = Row(id="a", prompt="p", prompt_text="ab", token_ids=[5, 9], api=api)
    row.finish_reason = "length"
    pairs = [[(5, -0.25), (6, -1.0)], [(9, -0.5), (10, -2.0)]]
    row.token_logprobs = TokenLogprobs.from_pairs([-0.25, -0.5], pairs, 2)
    Detokenize(tokenizer)([row])
    return row


def test_logprobs_of_a_completion_and_a_chat_choice_are_the_apis_shapes(tiny_tokenizer):
    t = {i: tiny_tokenizer.decode([i]) for i in (5, 6, 9, 10)}
    [text] = output_line([named_row(tiny_tokenizer, "text")], "m", 0)["response"]["body"]["choices"]
    assert text["logprobs"] == {
        "tokens": [t[5], t[9]],
        "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{t[5]: -0.25, t[6]: -1.0}, {t[9]: -0.5, t[10]: -2.0}],
        "text_offset": [2, 2 + len(t[5])],
    }
    [chat] = output_line([named_row(tiny_tokenizer, "chat")], "m", 0)["response"]["body"]["choices"]

    def token(i: int, logprob: float) -> dict:
        return {"token": t[i], "logprob": logprob, "bytes": list(t[i].encode())}

    assert chat["logprobs"] == {
        "content": [
            {**token(5, -0.25), "top_logprobs": [token(5, -0.25), token(6, -1.0)]},
            {**token(9, -0.5), "top_logprobs": [token(9, -0.5), token(10, -2.0)]},
        ]
    }


def test_stats_count_the_lines_the_shards_hold_with_n(tmp_path, tiny_model_dir):
    """--format openai --n 3, a row failing: its one error line is one row and one error, and
    a line's prompt tokens count once, as a resume and a data-parallel run count them (the run
    counted each sample: 12 rows and 3 errors where the shards hold 10 and 1)."""
    from bulkgen.io.job import JobDir

    records = [{"id": f"r{i}", "prompt": None if i == 1 else f"hello {i}"} for i in range(4)]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    sampling = SamplingParams(max_tokens=4, temperature=0.8, seed=1)
    config = make_config(tmp_path, tiny_model_dir, [path], format="openai", n=3, sampling=sampling)
    stats = run(config, factory())
    done = JobDir(tmp_path / "out").scan()
    assert (stats["rows"], stats["errors"]) == (done.rows, done.errors) == (10, 1)
    assert stats["prompt_tokens"] == done.prompt_tokens
    assert stats["this_run"]["rows"] == 10 and stats["this_run"]["errors"] == 1
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert (on_disk["rows"], on_disk["errors"]) == (10, 1)
