"""engine/schema_support.py: JSON Schemas the grammar cannot enforce are refused, each keyword on
the refused list is one xgrammar's grammar really ignores (it accepts a value breaking it), and
the kept keywords are enforced (it refuses such a value)."""

from __future__ import annotations

import json

import pytest

from bulkgen.engine.grammar import JSON_LAYOUT
from bulkgen.engine.schema_support import check_schema

xgr = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string  # noqa: E402


def accepts(schema: dict, text: str) -> bool:
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), **JSON_LAYOUT)
    return _is_grammar_accept_string(grammar, text)


# (schema, a value breaking only the keyword named, words of the refusal)
IGNORED = [
    ({"type": "number", "multipleOf": 0.5}, "1.7", "'multipleOf' on a non-integer"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]", "unique"),
    ({"type": "array", "contains": {"const": 5}}, "[]", "'contains'"),
    ({"allOf": [{"type": "integer", "minimum": 3}, {"maximum": 4}]}, "7", "'allOf' of more"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1", "'oneOf' whose branches"),
    ({"type": "integer", "not": {"const": 3}}, "3", "'not'"),
    ({"if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, '{"a": 1}', "'if'"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, '{"a": 1}', "naming 'b'"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, '{"a": 1}', "'dependentRequired'"),
    ({"type": "object", "unevaluatedProperties": False}, '{"b": 1}', "'unevaluatedProperties'"),
    # Keywords xgrammar drops beside others (helper-42's audit: each ran to a `stop` row
    # breaking the schema)
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, '"abcdef"', "beside 'pattern'"),
    ({"type": "string", "format": "date", "pattern": "^2024"}, '"2023-01-01"', "beside 'format'"),
    ({"type": "integer", "enum": [1, "a"]}, '"a"', "'enum' holding a value"),
    ({"type": "integer", "minimum": 5, "anyOf": [{"maximum": 6}]}, "true", "beside 'anyOf'"),
    ({"minimum": 5}, "1", "'minimum' without a 'type'"),
    ({"type": "integer", "multipleOf": 2.5}, "3", "of a fraction"),
    ({"$defs": {"n": {"$anchor": "num", "type": "integer"}}, "$ref": "#num"}, '"s"', "'#num'"),
    (
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "required": ["xa"]},
        "{}",
        "naming 'xa'",
    ),
    ({"oneOf": [{"const": 1}, {"const": 1.0}]}, "1", "'oneOf' whose branches"),
]


@pytest.mark.parametrize("schema, bad, words", IGNORED)
def test_a_keyword_the_grammar_ignores_is_refused(schema, bad, words):
    assert accepts(schema, bad)  # the grammar lets the value through: the schema would not
    with pytest.raises(ValueError, match="JSON schema not supported: .*" + words):
        check_schema(schema)


ENFORCED = [
    ({"type": "integer", "multipleOf": 3}, "4"),
    ({"type": "object", "minProperties": 2}, "{}"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, '{"b": 1}'),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, '{"xa": "s"}'),
    ({"type": "number", "exclusiveMinimum": 3}, "3"),
    ({"type": "string", "pattern": "^a+$"}, '"b"'),
    ({"type": "string", "format": "date"}, '"hello"'),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1, 2]"),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "null"),
    ({"allOf": [{"type": "integer"}]}, '"s"'),  # one member: the one xgrammar reads
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "null"),  # disjoint branches
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}, '"s"'),
    # pydantic's forms: annotations beside $ref / anyOf, a Literal's const with enum and type
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "description": "d"}, '"s"'),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "T"}, '"s"'),
    ({"const": "a", "enum": ["a"], "type": "string"}, '"b"'),
    ({"enum": ["x", "y"], "type": "string", "title": "E"}, '"z"'),
    # pydantic v2's discriminated union: OpenAPI's "discriminator" (and "x-" keys) beside oneOf
    (
        {
            "$defs": {
                "Cat": {
                    "type": "object",
                    "properties": {"k": {"const": "cat", "type": "string"}},
                    "required": ["k"],
                },
                "Dog": {
                    "type": "object",
                    "properties": {"k": {"const": "dog", "type": "string"}},
                    "required": ["k"],
                },
            },
            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
            "discriminator": {"propertyName": "k"},
            "x-origin": "pydantic",
        },
        '{"k": "cow"}',
    ),
]


@pytest.mark.parametrize("schema, bad", ENFORCED)
def test_a_keyword_the_grammar_enforces_is_taken(schema, bad):
    check_schema(schema)
    assert not accepts(schema, bad)


def test_a_discriminated_union_is_taken_and_an_overlapping_one_refused():
    def pet(kind: str) -> dict:
        return {"type": "object", "properties": {"kind": {"const": kind}, "name": {}},
                "required": ["kind", "name"]}  # fmt: skip

    branches = [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]
    union = {"$defs": {"Cat": pet("cat"), "Dog": pet("dog")}, "type": "object",
             "properties": {"pet": {"oneOf": branches}}}  # fmt: skip
    check_schema(union)  # pydantic writes its tagged unions this way
    check_schema({"oneOf": [{"enum": ["a", "b"]}, {"const": "c"}]})
    union["$defs"]["Dog"] = pet("cat")
    with pytest.raises(
        ValueError, match=r"'oneOf' whose branches can overlap .* at /properties/pet"
    ):
        check_schema(union)


def test_refusals_are_found_at_any_depth_and_name_where():
    nested = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(ValueError, match=r"'uniqueItems' at /properties/tags"):
        check_schema(nested)
    tuple_items = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                   "items": [{"type": "number", "multipleOf": 2.5}]}  # fmt: skip
    with pytest.raises(ValueError, match=r"at /items/0"):
        check_schema(tuple_items)
    check_schema({"type": "array", "uniqueItems": False})  # no constraint: nothing to enforce
    check_schema({"type": "object", "properties": {"not": {"type": "string"}}})  # a name


def test_an_invalid_schema_names_the_keyword_and_where():
    with pytest.raises(ValueError, match=r"invalid JSON schema: -1 is less .* \(at /properties/a"):
        check_schema({"type": "object", "properties": {"a": {"type": "string", "minLength": -1}}})


def test_a_schema_nested_too_deeply_to_check_is_one_value_error():
    """About 1,000 nested objects: a RecursionError traceback (2,006 lines from the CLI) before."""
    schema: dict = {"type": "integer"}
    for _ in range(1000):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    with pytest.raises(ValueError, match="nests too deeply"):
        check_schema(schema)
