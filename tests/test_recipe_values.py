"""A recipe's fields checked as it loads: unknown fields, bad values, numbers click would
truncate, values of the wrong shape, null and text that is not UTF-8, each one line naming the
field."""

from __future__ import annotations

import pytest
from test_recipes import bulkgen, write_recipe

from bulkgen.cli import run as run_command
from bulkgen.errors import UserError
from bulkgen.recipes import load_recipe


def test_an_unknown_field_is_an_error_naming_it(tmp_path):
    path = write_recipe(tmp_path, {"max_token": 7})
    with pytest.raises(UserError, match=r"unknown field 'max_token' \(did you mean 'max_tokens'"):
        load_recipe(path, run_command)


def test_a_bad_value_is_an_error_naming_the_field(tmp_path):
    path = write_recipe(tmp_path, {"format": "xml"})
    with pytest.raises(UserError, match="field 'format': 'xml' is not one of"):
        load_recipe(path, run_command)
    path = write_recipe(tmp_path, {"max_tokens": [1, 2]})
    with pytest.raises(UserError, match="field 'max_tokens' takes one value"):
        load_recipe(path, run_command)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("seed", 1.5, "1.5 is not an integer"),
        ("n", 2.7, "2.7 is not an integer"),
        ("max_tokens", 3.0, r"3.0 is not an integer \(write 3\)"),  # as --max-tokens 3.0
        ("tensor_parallel", 1.5, "1.5 is not an integer"),
        ("stop_token_id", [2, 2.5], "2.5 is not an integer"),
        ("seed", True, "true is not a number"),
        ("temperature", False, "false is not a number"),
    ],
)
def test_a_number_click_would_truncate_is_an_error_naming_the_field(
    tmp_path, field, value, message
):
    """YAML's numbers and bools reach click as they are, and int() truncates them silently."""
    path = write_recipe(tmp_path, {field: value})
    with pytest.raises(UserError, match=f"field '{field}': {message}"):
        load_recipe(path, run_command)


def test_the_cli_refuses_a_fractional_seed_in_a_recipe_in_one_line(tmp_path):
    path = write_recipe(tmp_path, {"inputs": "a.jsonl", "out": "o", "seed": 1.5})
    result = bulkgen("run", "--recipe", path)
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: recipe {path}: field 'seed': 1.5 is not an integer"
    ]
    assert not (tmp_path / "o").exists()


def test_a_bad_score_section_is_an_error(tmp_path):
    path = write_recipe(tmp_path, {"score": {"reference": "answer"}})
    with pytest.raises(UserError, match="unknown field 'score.reference'"):
        load_recipe(path, run_command)


def test_a_recipe_that_is_not_a_mapping_is_an_error(tmp_path):
    (tmp_path / "r.yaml").write_text("- max_tokens: 3\n")
    with pytest.raises(UserError, match="must be a mapping"):
        load_recipe(tmp_path / "r.yaml", run_command)
    (tmp_path / "r.yaml").write_text("max_tokens: [3\n")
    with pytest.raises(UserError, match="is not valid YAML"):
        load_recipe(tmp_path / "r.yaml", run_command)


def test_the_cli_reports_an_unknown_field_in_one_line(tmp_path):
    path = write_recipe(tmp_path, {"inputs": "a.jsonl", "out": "o", "temprature": 0.7})
    result = bulkgen("run", "--recipe", path)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown field 'temprature'" in lines[0], result.stderr
    assert "did you mean 'temperature'" in lines[0]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"temperature": {"a": 1}}, "field 'temperature' takes text or a number, not dict"),
        ({"seed": {"a": 1}}, "field 'seed' takes text or a number, not dict"),
        ({"system": ["Be brief", "be kind"]}, "field 'system' takes one value, not a list"),
        ({"model": ["a", "b"]}, "field 'model' takes one value, not a list"),
        ({"choice": [{"a": 1}]}, "field 'choice' takes text or a number, not dict"),
        ({"stop": [None]}, "field 'stop' takes text or a number, not null"),
    ],
)
def test_values_of_the_wrong_shape_are_one_line(tmp_path, fields, message):
    """They were tracebacks, or lists joined with commas into one system message or model."""
    with pytest.raises(UserError, match=message):
        load_recipe(write_recipe(tmp_path, fields), run_command)


def test_null_is_a_field_not_set_and_a_recipe_not_utf8_is_one_line(tmp_path):
    """out: null wrote the results into a folder named None."""
    recipe = load_recipe(write_recipe(tmp_path, {"out": None, "stop": None, "max_tokens": 5}),
                         run_command)  # fmt: skip
    assert recipe.options == {"max_tokens": 5}
    path = tmp_path / "latin1.yaml"
    path.write_bytes("system: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match="is not UTF-8 text"):
        load_recipe(path, run_command)
