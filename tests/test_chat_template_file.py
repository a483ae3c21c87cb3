"""--chat-template-file: a Jinja chat template of the user's instead of the model's, as vLLM's
--chat-template takes one."""

from __future__ import annotations

import json

from test_chat import CHAT, rendered, sent, template_ids
from test_cli import bulkgen
from test_pipeline import factory, make_config, output, write_jsonl

from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.pipeline import run

USER = {"role": "user", "content": "Hello"}
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)


def test_prompts_and_conversations_are_rendered_with_the_file(tmp_path, tiny_model_dir,
                                                              tiny_tokenizer):  # fmt: skip
    records = [{"id": "chat", "messages": CHAT}, {"id": "plain", "prompt": "Hello"}]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, tiny_model_dir, [path], chat_template_text=TEMPLATE), factory())
    tiny_tokenizer = type(tiny_tokenizer).from_pretrained(tiny_model_dir)
    tiny_tokenizer.chat_template = TEMPLATE
    ids = sent(["chat", "plain"])
    assert ids["chat"] == template_ids(tiny_tokenizer, CHAT)
    assert ids["plain"] == template_ids(tiny_tokenizer, [{"role": "user", "content": "Hello"}])
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["chat"]["prompt"] == rendered(tiny_tokenizer, CHAT)
    assert rows["plain"]["prompt"] == "Hello"  # a text prompt's column keeps it as given


def write(tmp_path, text: str, name: str = "chat.jinja"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_cli_records_the_template_and_a_changed_file_is_another_job(
    tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"messages": [USER]}])
    template = write(tmp_path, TEMPLATE)
    args = ["run", inputs, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q"]
    result = bulkgen(*args, "--chat-template-file", template)
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "out" / "job.json").read_text())["settings"]
    assert settings["chat_template_text"] == TEMPLATE
    [row] = output(tmp_path / "out")
    assert row["prompt"] == "[USER] Hello\n[ASSISTANT] "
    template.write_text(TEMPLATE.replace("[ASSISTANT] ", "[BOT] "))
    rerun = bulkgen(*args, "--chat-template-file", template)
    assert rerun.exit_code == 1 and "chat_template_text" in rerun.stderr, rerun.output


def test_a_recipe_names_the_file_beside_it(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    folder = tmp_path / "recipes"
    folder.mkdir()
    write(folder, TEMPLATE, "mine.jinja")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"messages": [USER]}])
    recipe = folder / "job.yaml"
    recipe.write_text(f"model: {tiny_model_dir}\nchat_template_file: mine.jinja\n")
    result = bulkgen("run", inputs, "-o", tmp_path / "out", "-q", "--recipe", recipe)
    assert result.exit_code == 0, result.output
    assert output(tmp_path / "out")[0]["prompt"] == "[USER] Hello\n[ASSISTANT] "


def test_mistakes_are_one_line_before_any_row(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hello"}])
    args = ["run", inputs, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q"]
    broken = write(tmp_path, "{% for m in messages %}\n{{ m['content'] }", "broken.jinja")
    cases = [
        (broken, "--chat-template-file line 2"),
        (tmp_path / "missing.jinja", "cannot read the --chat-template-file"),
        (write(tmp_path, "no content here", "empty.jinja"), "without its content"),
        (write(tmp_path, "{{ raise_exception('no') }}", "raises.jinja"), "fails on"),
    ]
    for path, message in cases:
        result = bulkgen(*args, "--chat-template-file", path)
        assert result.exit_code == 1, result.output
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and message in line, line
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("part-*"))
    both = bulkgen(*args, "--chat-template-file", write(tmp_path, TEMPLATE), "--no-chat-template")
    assert both.exit_code == 2 and "leave one out" in both.output


def test_a_template_that_drops_the_content_is_refused_whatever_its_own_text(
    tmp_path, tiny_model_dir, monkeypatch
):
    """A typo'd field renders as nothing in Jinja; the check looked for "hi", which
    "<think>" holds."""
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hello"}])
    drops = write(tmp_path, "{% for m in messages %}{{ m['contents'] }}{% endfor %}<think>\n")
    args = ["run", inputs, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q"]
    result = bulkgen(*args, "--chat-template-file", drops)
    assert result.exit_code == 1 and "without its content" in result.stderr, result.output


def test_a_template_that_needs_a_system_message_runs_with_system(
    tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "{}")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hello"}])
    first = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}"
    needs_system = write(tmp_path, first + "{% endif %}" + TEMPLATE)
    args = ["run", inputs, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q"]
    result = bulkgen(*args, "--chat-template-file", needs_system, "--system", "Be brief.")
    assert result.exit_code == 0, result.output
    [row] = output(tmp_path / "out")
    assert row["finish_reason"] != "error"
    alone = bulkgen(*args, "--overwrite", "--chat-template-file", needs_system)
    assert alone.exit_code == 1 and "system first" in alone.stderr, alone.output
