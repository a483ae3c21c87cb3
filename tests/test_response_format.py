"""Structured output per row: a response_format column (OpenAI's shape, an object or JSON text)
or an OpenAI Batch body's response_format overrides the job's flags for that row; a bad one is
that row's error record naming the field. Also the synthetic-json recipe and the openai output."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_pipeline import RecordingEngine, factory, make_config, output, write_jsonl

from bulkgen.cli import run as run_command
from bulkgen.config import SamplingParams
from bulkgen.errors import UserError
from bulkgen.io.openai import output_line
from bulkgen.pipeline import run
from bulkgen.recipes import load_recipe
from bulkgen.row import Row

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
CANONICAL = json.dumps(SCHEMA, separators=(",", ":"))
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}
JOB = SamplingParams(max_tokens=8, temperature=0.0, regex="[a-z]+")  # the job's flag: --regex


def constraints(params: SamplingParams) -> tuple:
    return params.json_schema, params.regex, params.choice


def test_response_format_rows_override_the_job_constraint(tmp_path, tiny_model_dir):
    records = [
        {"id": "plain", "prompt": "Hi"},
        {"id": "object", "prompt": "Hi", "response_format": {"type": "json_object"}},
        {"id": "schema", "prompt": "Hi", "response_format": AS_SCHEMA},
        {"id": "text", "prompt": "Hi", "response_format": {"type": "text"}},
        {"id": "as-json-text", "prompt": "Hi", "response_format": json.dumps(AS_SCHEMA)},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, tiny_model_dir, [path], sampling=JOB), factory())
    params = [p for _, p in RecordingEngine.instances[0].added.values()]
    got = dict(zip([r["id"] for r in records], map(constraints, params), strict=True))
    assert got["plain"] == (None, "[a-z]+", None)  # the job's --regex
    assert got["object"] == ('{"type":"object"}', None, None)
    assert got["schema"] == got["as-json-text"] == (CANONICAL, None, None)
    assert got["text"] == (None, None, None)  # text: unconstrained, whatever the flags
    assert all(r["error"] is None for r in output(tmp_path / "out"))


def test_a_json_rows_const_null_is_kept(tmp_path, tiny_model_dir):
    """`"const": null` in a JSONL row's (or a Batch body's) schema is the schema's: it was
    dropped as if it were a Parquet struct's padding, and the field took any value."""
    schema = {"type": "object", "properties": {"x": {"const": None}}, "required": ["x"]}
    spec = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    path = write_jsonl(
        tmp_path / "in.jsonl", [{"id": "a", "prompt": "Hi", "response_format": spec}]
    )
    run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    (params,) = [p for _, p in RecordingEngine.instances[0].added.values()]
    assert json.loads(params.json_schema)["properties"]["x"] == {"const": None}


def test_a_bad_response_format_is_that_rows_error_and_the_run_goes_on(tmp_path, tiny_model_dir):
    bad = {
        "kind": {"type": "xml"},
        "no-schema": {"type": "json_schema", "json_schema": {"name": "x"}},
        "not-json": "{type: json_object",
        "not-a-schema": {"type": "json_schema", "json_schema": {"schema": {"type": "strng"}}},
        "a-list": [{"type": "text"}],
    }
    records = [{"id": "ok", "prompt": "Hi", "response_format": {"type": "json_object"}}]
    records += [{"id": k, "prompt": "Hi", "response_format": v} for k, v in bad.items()]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    stats = run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["ok"]["error"] is None and stats["rows"] == 6
    for row_id in bad:
        assert rows[row_id]["finish_reason"] == "error"
        assert "response_format" in rows[row_id]["error"], rows[row_id]["error"]
    assert "xml" in rows["kind"]["error"]
    assert "invalid JSON schema" in rows["not-a-schema"]["error"]


def test_parquet_response_format_as_json_text_or_a_struct(tmp_path, tiny_model_dir):
    """A struct column gives each row every key of every row (missing ones null): the nulls are
    not part of the schema."""
    table = pa.table({
        "id": ["text-col", "plain"],
        "prompt": ["Hi", "Hi"],
        "response_format": [json.dumps(AS_SCHEMA), None],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet")
    other = {"type": "object", "properties": {"m": {"type": "string"}}}
    other_format = {"type": "json_schema", "json_schema": {"name": "m", "schema": other}}
    structs = [AS_SCHEMA, {"type": "json_object"}, other_format]
    pq.write_table(pa.table({"id": ["struct", "object", "other"], "prompt": ["Hi"] * 3,
                             "response_format": structs}), tmp_path / "b.parquet")  # fmt: skip
    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    run(make_config(tmp_path, tiny_model_dir, files, sampling=JOB), factory())
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert all(r["error"] is None for r in rows.values()), rows
    params = [p for _, p in RecordingEngine.instances[0].added.values()]
    names = ["text-col", "plain", "struct", "object", "other"]
    got = dict(zip(names, map(constraints, params), strict=True))
    assert got["text-col"] == got["struct"] == (CANONICAL, None, None)
    assert got["plain"] == (None, "[a-z]+", None)
    assert got["object"] == ('{"type":"object"}', None, None)
    assert json.loads(got["other"][0]) == other  # not {"m": ..., "n": null}, "required": null


BATCH = [
    {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "A number?"}],
              "response_format": AS_SCHEMA}},
    {"custom_id": "completion", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "A JSON object:", "response_format": {"type": "json_object"}}},
    {"custom_id": "plain", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Hi"}]}},
    {"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": 3}}},
]  # fmt: skip


def test_batch_bodies_response_format_is_honoured_for_chat_and_completions(
    tmp_path, tiny_model_dir
):
    path = write_jsonl(tmp_path / "batch.jsonl", BATCH)
    run(make_config(tmp_path, tiny_model_dir, [path], format="openai"), factory())
    params = [p for _, p in RecordingEngine.instances[0].added.values()]
    assert [constraints(p) for p in params] == [
        (CANONICAL, None, None),
        ('{"type":"object"}', None, None),
        (None, None, None),
    ]
    lines = [json.loads(x) for f in sorted((tmp_path / "out").glob("part-*")) for x in f.open()]
    errors = {line["custom_id"]: line["error"] for line in lines}
    assert errors["chat"] is None and errors["plain"] is None
    assert "response_format" in errors["bad"]["message"]


def test_openai_chat_choices_carry_the_json_text_as_message_content():
    row = Row("r", "prompt", text='{"n": 3}', finish_reason="stop", api="chat")
    [choice] = output_line([row], "m", 0)["response"]["body"]["choices"]
    assert choice["message"] == {"role": "assistant", "content": '{"n": 3}'}
    assert json.loads(choice["message"]["content"]) == {"n": 3}


SHIPPED = os.path.join(os.path.dirname(__file__), os.pardir, "recipes")


def test_the_synthetic_json_recipe_loads_with_its_schema():
    jsonschema = pytest.importorskip("jsonschema")
    recipe = load_recipe(os.path.join(SHIPPED, "synthetic-json.yaml"), run_command)
    options = recipe.options
    assert all(os.path.isfile(p) for p in options["inputs"])
    assert os.path.isfile(options["prompt_template"][1:])
    schema = json.loads(options["json_schema"])  # the YAML mapping, as JSON text
    jsonschema.validators.validator_for(schema).check_schema(schema)
    assert schema["required"] == ["question", "answer", "difficulty"]
    assert schema["properties"]["difficulty"]["enum"] == ["easy", "medium", "hard"]
    record = {"question": "What do plants make in photosynthesis?", "answer": "Sugar.",
              "difficulty": "easy"}  # fmt: skip
    jsonschema.validate(record, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**record, "difficulty": "trivial"}, schema)


def test_a_recipe_json_schema_file_is_relative_to_the_recipe(tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "n.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "job.yaml").write_text("json_schema: schemas/n.json\n")
    options = load_recipe(tmp_path / "job.yaml", run_command).options
    assert options["json_schema"] == str(tmp_path / "schemas" / "n.json")


def test_recipe_fields_of_the_constraint_flags(tmp_path):
    (tmp_path / "job.yaml").write_text("json: true\nregex: '[0-9]+'\nchoice: ['yes', 'no']\n")
    options = load_recipe(tmp_path / "job.yaml", run_command).options
    assert options["json_object"] is True and options["regex"] == "[0-9]+"
    assert options["choice"] == ["yes", "no"]


@pytest.mark.parametrize("field", ["choice: [yes, no]", "choice: on"])
def test_unquoted_yes_no_choices_in_a_recipe_are_refused(tmp_path, field):
    """YAML 1.1 reads yes and no as booleans: the run would constrain to 'True'/'False'."""
    (tmp_path / "job.yaml").write_text(field + "\n")
    with pytest.raises(UserError, match="field 'choice'.*quote"):
        load_recipe(tmp_path / "job.yaml", run_command)


def test_rows_with_one_schema_check_it_once(tmp_path, tiny_model_dir, monkeypatch):
    import bulkgen.structured

    checked = []
    monkeypatch.setattr(bulkgen.structured, "check_grammar", checked.append)
    records = [{"id": str(i), "prompt": "Hi", "response_format": AS_SCHEMA} for i in range(5)]
    records.append({"id": "other", "prompt": "Hi", "response_format": {"type": "json_object"}})
    path = write_jsonl(tmp_path / "in.jsonl", records)
    run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    schemas = sorted(p.json_schema for p in checked if p.constrained)
    assert schemas == sorted([CANONICAL, '{"type":"object"}'])  # once each, not once per row
