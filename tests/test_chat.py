"""Chat: a messages column rendered with the model's chat template; --system; --chat."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cli import bulkgen
from test_pipeline import RecordingEngine, factory, make_config, output, write_jsonl

from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.errors import UserError
from bulkgen.pipeline import run

CHAT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Spain?"},
]
SYSTEM = {"role": "system", "content": "Answer in one word."}


def rendered(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def template_ids(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)[
        "input_ids"
    ]


def sent(row_ids):
    """The prompt ids the engine got, by row id (the engine's ids are in input order)."""
    added = RecordingEngine.instances[0].added.values()
    return {row_id: ids for row_id, (ids, _) in zip(row_ids, added, strict=True)}


def test_a_messages_column_is_rendered_with_the_chat_template(tmp_path, tiny_model_dir,
                                                              tiny_tokenizer):  # fmt: skip
    records = [{"id": "chat", "messages": CHAT}, {"id": "plain", "prompt": "Hello"}]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    ids = sent(["chat", "plain"])
    assert ids["chat"] == template_ids(tiny_tokenizer, CHAT)
    assert ids["plain"] == template_ids(tiny_tokenizer, [{"role": "user", "content": "Hello"}])
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["chat"]["prompt"] == rendered(tiny_tokenizer, CHAT)
    assert rows["chat"]["prompt"].endswith("<|assistant|>")  # add_generation_prompt
    assert rows["chat"]["error"] is None and rows["chat"]["text"]


def test_system_goes_before_conversations_and_templated_prompts(tmp_path, tiny_model_dir,
                                                                tiny_tokenizer):  # fmt: skip
    records = [
        {"id": "chat", "messages": CHAT},
        {"id": "own", "messages": [{"role": "system", "content": "Be terse."}, *CHAT[:1]]},
        {"id": "plain", "prompt": "Hello"},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, tiny_model_dir, [path], system=SYSTEM["content"]), factory())
    ids = sent(["chat", "own", "plain"])
    assert ids["chat"] == template_ids(tiny_tokenizer, [SYSTEM, *CHAT])
    assert ids["own"] == template_ids(tiny_tokenizer, records[1]["messages"])
    user = {"role": "user", "content": "Hello"}
    assert ids["plain"] == template_ids(tiny_tokenizer, [SYSTEM, user])


def test_a_bad_messages_value_is_that_rows_error(tmp_path, tiny_model_dir):
    records = [
        {"id": "ok", "messages": CHAT},
        {"id": "string", "messages": "hello"},
        {"id": "empty", "messages": []},
        {"id": "not-dicts", "messages": ["hello"]},
        {"id": "no-content", "messages": [{"role": "user"}]},
        {"id": "null", "messages": None},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    stats = run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["ok"]["error"] is None
    assert "not str" in rows["string"]["error"]
    assert "not an empty list" in rows["empty"]["error"]
    assert "message 0 is not a {role, content} object" in rows["not-dicts"]["error"]
    assert "message 0 has no string content" in rows["no-content"]["error"]
    assert rows["null"]["error"] == "messages is null"
    assert stats["errors"] == 5


def test_a_parquet_messages_column_under_another_name(tmp_path, tiny_model_dir, tiny_tokenizer):
    table = pa.table({"id": ["a"], "conversation": [CHAT]})
    pq.write_table(table, tmp_path / "in.parquet")
    config = make_config(tmp_path, tiny_model_dir, [tmp_path / "in.parquet"],
                         messages_column="conversation")  # fmt: skip
    run(config, factory())
    assert sent(["a"])["a"] == template_ids(tiny_tokenizer, CHAT)


def test_a_conversation_in_the_prompt_column_under_messages_column_prompt(
    tmp_path, tiny_model_dir, tiny_tokenizer
):
    """TRL's conversational datasets hold the conversation in "prompt": --messages-column prompt
    renders it (it was every row's error); without the flag the error says what to pass."""
    records = [{"id": "a", "prompt": CHAT}, {"id": "b", "prompt": "Hello"}]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, tiny_model_dir, [path], messages_column="prompt"), factory())
    ids = sent(["a", "b"])
    assert ids["a"] == template_ids(tiny_tokenizer, CHAT)
    assert ids["b"] == template_ids(tiny_tokenizer, [{"role": "user", "content": "Hello"}])
    other = tmp_path / "other"
    other.mkdir()
    run(make_config(other, tiny_model_dir, [path]), factory())
    rows = {r["id"]: r for r in output(other / "out")}
    assert "--messages-column" in rows["a"]["error"] and rows["b"]["error"] is None


def test_system_without_the_template_is_refused(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hello"}])
    config = make_config(tmp_path, tiny_model_dir, [path], chat_template=False, system="Hi")
    with pytest.raises(UserError, match="--system needs the model's chat template"):
        run(config, factory())


def test_chat_is_the_chat_template_flag(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hello"}])
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q", "--chat")
    assert result.exit_code == 0, result.output
    settings = (tmp_path / "out" / "job.json").read_text()
    assert '"chat_template": true' in settings
    assert "--chat" in bulkgen("run", "--help").output


def test_messages_for_a_model_without_a_chat_template_are_row_errors(tmp_path, tiny_model_dir):
    import json
    import shutil

    model = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config_file = model / "tokenizer_config.json"
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "chat_template": None})
    )
    records = [{"id": "chat", "messages": CHAT}, {"id": "plain", "prompt": "Hello"}]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, model, [path]), factory())
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["chat"]["error"] == "the model has no chat template to render messages with"
    assert rows["plain"]["error"] is None and rows["plain"]["prompt"] == "Hello"
