"""OpenAI Batch request bodies as OpenAI's own API takes them (io/openai.batch_row, io/jsonl.py,
text/chat.py, preflight.py): an explicit null max_completion_tokens leaves max_tokens to decide;
a one-element array of token arrays is that prompt; a negative seed (OpenAI's is an int64) and
top_p 0 (inside OpenAI's [0, 1]) are answered, not error lines; a line without a body keeps its
custom_id on its error line; a developer message renders as a system one; --prompt-template
with a Batch input is refused. From helper-47's audit."""

from __future__ import annotations

import json

import pytest
from test_pipeline import make_config, write_jsonl

from bulkgen.errors import UserError
from bulkgen.io.inputs import find_sources
from bulkgen.io.openai import batch_row
from bulkgen.io.reader import Reader
from bulkgen.io.validate import check_row
from bulkgen.preflight import checked_reader
from bulkgen.text.chat import Conversations, checked_messages

HI = [{"role": "user", "content": "hi"}]


def chat(**body) -> dict:
    return {"custom_id": "r", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": HI, **body}}  # fmt: skip


def test_a_null_max_completion_tokens_leaves_max_tokens_to_decide():
    """SDK models dumped without exclude_none carry the null: the row took the job's 256."""
    row = batch_row(chat(max_completion_tokens=None, max_tokens=2), 1)
    assert row.overrides["max_tokens"] == 2
    assert batch_row(chat(max_completion_tokens=3, max_tokens=2), 1).overrides["max_tokens"] == 3


def test_a_one_element_array_of_token_ids_is_that_prompt():
    record = {"custom_id": "r", "method": "POST", "url": "/v1/completions",
              "body": {"model": "m", "prompt": [[5, 6, 7]], "max_tokens": 2}}  # fmt: skip
    assert batch_row(record, 1).prompt == [5, 6, 7]  # was an error line ("not of token ids")


@pytest.mark.parametrize("body", [{"seed": -42, "temperature": 1}, {"top_p": 0}])
def test_values_openai_takes_are_answered_not_error_lines(body):
    row = batch_row(chat(**body), 1)
    check_row(row)
    assert row.error is None
    if "seed" in body:
        assert 0 <= row.overrides["seed"] < 2**63
    else:  # top_p 0 keeps the likeliest token only
        assert row.overrides.get("top_k") == 1 and "top_p" not in row.overrides


def test_a_line_without_a_body_keeps_its_custom_id(tmp_path):
    good = chat()
    bad = {"custom_id": "req-2", "method": "POST", "url": "/v1/chat/completions", "bdoy": {}}
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    rows = [r for b in Reader(find_sources([str(path)]), "prompt", "id").batches() for r in b]
    assert rows[1].id == "req-2" and "needs custom_id and body" in rows[1].error


def test_a_developer_message_renders_as_a_system_message(tiny_tokenizer):
    conversations = Conversations(tiny_tokenizer, None)
    user = {"role": "user", "content": "Say hello."}
    as_developer = [{"role": "developer", "content": "Answer in French."}, user]
    as_system = [{"role": "system", "content": "Answer in French."}, user]
    rendered = conversations.render(checked_messages(as_developer))
    assert rendered == conversations.render(checked_messages(as_system))
    assert "developer" not in rendered


def test_a_prompt_template_with_a_batch_input_is_refused(tmp_path, tiny_model_dir):
    """It replaced every completions request's prompt silently (chat ones kept theirs), or with
    a column named made every request an error line."""
    path = write_jsonl(tmp_path / "batch.jsonl", [chat()])
    config = make_config(tmp_path, tiny_model_dir, [path], prompt_template="Fixed text")
    with pytest.raises(UserError, match="--prompt-template with an OpenAI Batch input"):
        checked_reader(config)


def test_characters_splitlines_takes_for_line_ends_are_escaped():
    """A completion holding U+0085 (the tiny model wrote one in a 400-request run), U+2028 or
    U+2029 split its line in two for str.splitlines() and readers like it."""
    from bulkgen.io.json_line import json_line

    text = "a\u2028b\u0085c\u2029d\n\u00e9"
    line = json_line({"text": text})
    assert len(line.splitlines()) == 1 and json.loads(line)["text"] == text
    assert "\u00e9" in line  # other characters stay as they are


@pytest.mark.parametrize(
    "body, named",
    [
        ({"echo": True}, "echo: true"),
        ({"suffix": " the end."}, "suffix"),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, 'tool_choice "required"'),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice {"),
    ],
)
def test_fields_whose_answer_bulkgen_cannot_give_are_that_requests_error(body, named):
    """They were ignored: the line answered something other than what was asked (no prompt
    echoed, no suffix, no tool call)."""
    row = batch_row(chat(**body), 3)
    assert row.error is not None and named in row.error and "not supported" in row.error
    tuned = batch_row(chat(tools=[{"type": "function"}], tool_choice="auto", stream=True), 3)
    check_row(tuned)
    assert tuned.error is None  # tools left to the model's choice, stream: ignored as before
