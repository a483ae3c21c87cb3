"""Structured output as a user asks for it on the command line and in SamplingParams:
--json-schema, --json, --regex, --choice (at most one), checked before any work."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.config import SamplingParams
from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.engine.grammar import check_grammar

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
CANONICAL = '{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}'


@pytest.fixture
def fake_engine(monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 2}))


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Say hi.", "2+2="]))
    return path


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def recorded_sampling(out) -> dict:
    return json.loads((out / "job.json").read_text())["settings"]["sampling"]


# ---- SamplingParams ----------------------------------------------------------------------


def test_a_schema_given_as_a_dict_or_as_text_is_the_same_compact_text():
    as_dict = SamplingParams(json_schema=SCHEMA)
    as_text = SamplingParams(json_schema=json.dumps(SCHEMA, indent=2))
    assert as_dict.json_schema == as_text.json_schema == CANONICAL
    assert as_dict == as_text and hash(as_dict) == hash(as_text)
    assert as_dict.constrained and not SamplingParams().constrained


def test_a_schemas_key_order_is_kept_because_the_output_follows_it():
    """The grammar writes properties in the schema's order: sorting would put answer first."""
    schema = {"type": "object", "properties": {"question": {}, "answer": {}}}
    kept = json.loads(SamplingParams(json_schema=schema).json_schema)
    assert list(kept["properties"]) == ["question", "answer"]


def test_a_choice_list_is_stored_as_a_tuple():
    params = SamplingParams(choice=["yes", "no"])
    assert params.choice == ("yes", "no") and params.constrained
    assert SamplingParams(regex=r"\d+").constrained


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"json_schema": SCHEMA, "regex": "a"}, "at most one"),
        ({"regex": "a", "choice": ["a"]}, "at most one"),
        ({"json_schema": "{not json"}, "invalid JSON schema: not JSON"),
        ({"json_schema": "[1, 2]"}, "invalid JSON schema: must be a JSON object"),
        ({"choice": []}, "choice must be a list of non-empty strings"),
        ({"choice": ["yes", ""]}, "choice must be a list of non-empty strings"),
        ({"regex": 5}, "regex must be a string"),
    ],
)
def test_bad_constraint_fields_are_value_errors(fields, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**fields)


def test_the_grammar_check_names_a_bad_schema_or_regex():
    with pytest.raises(ValueError, match=r"invalid JSON schema: .*text"):
        check_grammar(SamplingParams(json_schema={"properties": {"answer": {"type": "text"}}}))
    with pytest.raises(ValueError, match=r"invalid regex"):
        check_grammar(SamplingParams(regex="[a-"))
    check_grammar(SamplingParams(json_schema=SCHEMA))  # a good one passes
    check_grammar(SamplingParams(choice=("a", "b")))


# ---- flags -------------------------------------------------------------------------------


def test_run_help_lists_the_structured_output_flags():
    result = bulkgen("run", "--help")
    for flag in ["--json-schema", "--json ", "--regex", "--choice"]:
        assert flag in result.output


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--json-schema", json.dumps(SCHEMA)], {"json_schema": CANONICAL}),
        (["--json"], {"json_schema": '{"type":"object"}'}),
        (["--regex", r"[0-9]+"], {"regex": "[0-9]+"}),
        (["--choice", "yes", "--choice", "no"], {"choice": ["yes", "no"]}),
        ([], {"json_schema": None, "regex": None, "choice": None}),
    ],
)
def test_each_flag_sets_its_sampling_field_and_job_json_records_it(
    tmp_path, prompts_file, tiny_model_dir, fake_engine, flags, expected
):
    out = tmp_path / "out"
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", out, "-q", *flags)
    assert result.exit_code == 0, result.output
    sampling = recorded_sampling(out)
    assert {k: sampling[k] for k in expected} == expected
    others = {"json_schema", "regex", "choice"} - set(expected)
    assert all(sampling[k] is None for k in others)


def test_json_schema_reads_a_file(tmp_path, prompts_file, tiny_model_dir, fake_engine):
    schema_file = tmp_path / "record.json"
    schema_file.write_text(json.dumps(SCHEMA, indent=2))
    out = tmp_path / "out"
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", out, "-q",
                     "--json-schema", schema_file)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert recorded_sampling(out)["json_schema"] == CANONICAL


def test_two_constraint_flags_are_one_usage_error(tmp_path, prompts_file, tiny_model_dir):
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", tmp_path / "out",
                     "--json", "--regex", "a+")  # fmt: skip
    assert result.exit_code == 2
    assert "--json and --regex cannot be combined" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--json-schema", "{not json"], "--json-schema is not valid JSON"),
        (["--json-schema", "missing.json"], "--json-schema missing.json: cannot read it"),
        (["--json-schema", '{"type": "strng"}'], "--json-schema: invalid JSON schema: "),
        (["--regex", "(unclosed"], "--regex: invalid regex: "),
        (["--json-schema", '{"type": "string", "minLength": -1}'], "invalid JSON schema: -1 is"),
        (["--json-schema", '{"type": "array", "uniqueItems": true}'], "not supported: 'unique"),
    ],
)
def test_a_bad_schema_or_regex_flag_is_one_line_and_no_shards(
    tmp_path, prompts_file, tiny_model_dir, flags, words
):
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", tmp_path / "out", *flags)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_rerun_with_another_schema_asks_for_overwrite(
    tmp_path, prompts_file, tiny_model_dir, fake_engine
):
    out = tmp_path / "out"
    first = ("run", prompts_file, "-m", tiny_model_dir, "-o", out, "-q")
    assert bulkgen(*first, "--json-schema", json.dumps(SCHEMA)).exit_code == 0
    changed = bulkgen(*first, "--json")
    assert changed.exit_code == 1 and "sampling.json_schema was" in changed.stderr
    assert "--overwrite" in changed.stderr
    assert bulkgen(*first, "--json", "--overwrite").exit_code == 0
    assert recorded_sampling(out)["json_schema"] == '{"type":"object"}'
