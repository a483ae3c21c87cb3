"""--prompt-template: each row's prompt rendered from its columns; a failed rendering is that
row's error record."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV, FakeEngine
from bulkgen.errors import UserError
from bulkgen.pipeline import run
from bulkgen.run_config import RunConfig
from bulkgen.text.prompt_template import PromptTemplate, template_source

TEMPLATE = "Explain {{ topic }} to {{ audience }}."


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_rows(tmp_path, model_dir, inputs, **kw) -> dict[str, dict]:
    config = RunConfig(inputs=tuple(str(i) for i in inputs), out=str(tmp_path / "out"),
                       model=str(model_dir), quiet=True, **kw)  # fmt: skip
    run(config, engine_factory=lambda c: FakeEngine(c, steps=1))
    rows = []
    for path in sorted((tmp_path / "out").glob("part-*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return {r["id"]: r for r in rows}


def test_the_prompt_is_rendered_from_the_rows_columns(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "topic": "tides", "audience": "a child"},
        {"id": "b", "topic": "rust", "audience": "a chemist", "prompt": "ignored"},
    ])  # fmt: skip
    rows = run_rows(tmp_path, tiny_model_dir, [path], prompt_template=TEMPLATE)
    assert rows["a"]["prompt"] == "Explain tides to a child."
    assert rows["b"]["prompt"] == "Explain rust to a chemist."
    assert all(r["error"] is None and r["completion_tokens"] > 0 for r in rows.values())


def test_the_rendered_prompt_goes_through_the_chat_template(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "topic": "tides", "audience": "you"}])
    templated = run_rows(tmp_path / "1", tiny_model_dir, [path], prompt_template=TEMPLATE)
    plain_path = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "Explain tides to you."}])
    plain = run_rows(tmp_path / "2", tiny_model_dir, [plain_path])
    # The FakeEngine answers with the prompt's ids reversed: equal texts, equal token ids.
    assert templated["a"]["text"] == plain["a"]["text"]
    assert templated["a"]["prompt_tokens"] == plain["a"]["prompt_tokens"]


def test_a_missing_or_null_variable_is_that_rows_error_record(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "ok", "topic": "tides", "audience": "a child"},
        {"id": "missing", "topic": "tides"},
        {"id": "null", "topic": "tides", "audience": None},
    ])  # fmt: skip
    rows = run_rows(tmp_path, tiny_model_dir, [path], prompt_template=TEMPLATE)
    assert rows["ok"]["error"] is None
    for row_id in ("missing", "null"):
        assert rows[row_id]["finish_reason"] == "error"
        assert rows[row_id]["error"] == "--prompt-template failed: 'audience' is undefined"


def test_default_makes_a_variable_optional(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "topic": "tides"}])
    template = "Explain {{ topic }}{% if audience is defined %} to {{ audience }}{% endif %}."
    rows = run_rows(tmp_path, tiny_model_dir, [path], prompt_template=template)
    assert rows["a"]["prompt"] == "Explain tides."


def test_parquet_rows_need_no_prompt_column(tmp_path, tiny_model_dir):
    path = tmp_path / "t.parquet"
    table = {"topic": ["tides", "rust"], "audience": ["a child", None], "unused": [1, 2]}
    pq.write_table(pa.table(table), path)
    rows = run_rows(tmp_path, tiny_model_dir, [path], prompt_template=TEMPLATE)
    assert rows["t:0"]["prompt"] == "Explain tides to a child."
    assert rows["t:1"]["error"] == "--prompt-template failed: 'audience' is undefined"


def test_a_template_syntax_error_is_one_line_naming_the_line():
    with pytest.raises(UserError, match="--prompt-template line 2: "):
        PromptTemplate("Explain\n{{ topic }")


def test_at_path_reads_the_template_from_a_file(tmp_path):
    (tmp_path / "t.j2").write_text(TEMPLATE + "\n")
    assert template_source(f"@{tmp_path / 't.j2'}") == TEMPLATE + "\n"
    assert template_source(TEMPLATE) == TEMPLATE
    with pytest.raises(UserError, match="cannot read the --prompt-template file"):
        template_source(f"@{tmp_path / 'missing.j2'}")


def test_the_variables_are_the_columns_the_reader_reads():
    template = PromptTemplate("{% for x in items %}{{ x }}{% endfor %} {{ topic | upper }}")
    assert template.variables == ("items", "topic")


def test_the_cli_takes_a_template_file(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1}))
    (tmp_path / "t.j2").write_text(TEMPLATE + "\n")
    path = write_jsonl(tmp_path / "t.jsonl", [{"topic": "tides", "audience": "a child"}])
    out = tmp_path / "out"
    args = ["run", path, "-m", tiny_model_dir, "-o", out, "-q", "--format", "jsonl",
            "--prompt-template", f"@{tmp_path / 't.j2'}"]  # fmt: skip
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    row = json.loads((out / "part-00000.jsonl").read_text())
    assert row["prompt"] == "Explain tides to a child."
    assert (
        json.loads((out / "job.json").read_text())["settings"]["prompt_template"] == TEMPLATE + "\n"
    )
