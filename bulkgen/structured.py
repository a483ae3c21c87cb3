"""How users ask for structured output: the flags (--json-schema, --json, --regex, --choice) and
a row's OpenAI-shaped `response_format`, turned into SamplingParams' constraint fields
(json_schema, regex, choice). The engine enforces them; this module only reads and checks them."""

from __future__ import annotations

import json
from pathlib import Path

from bulkgen.config import SamplingParams
from bulkgen.engine.grammar import check_grammar
from bulkgen.errors import UserError

# --json and {"type": "json_object"}: any JSON object.
ANY_OBJECT = '{"type":"object"}'
# The fields a constraint sets; a response_format sets all of them (None: not that kind).
FIELDS = ("json_schema", "regex", "choice")
_FLAGS = {"json_schema": "--json-schema", "regex": "--regex", "choice": "--choice"}
_TYPES = ("text", "json_object", "json_schema")


def flag_fields(json_schema: str | None, any_json: bool, regex: str | None, choice) -> dict:
    """The constraint fields the flags ask for ({} for none). Two kinds at once is a ValueError
    (a usage error); an unreadable schema file or text that is not JSON is a UserError."""
    given = [
        flag
        for flag, value in (
            ("--json-schema", json_schema),
            ("--json", any_json or None),
            ("--regex", regex),
            ("--choice", choice or None),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} cannot be combined: give one of them")
    if json_schema is not None:
        return {"json_schema": _schema_text(json_schema)}
    if any_json:
        return {"json_schema": ANY_OBJECT}
    if regex is not None:
        return {"regex": regex}
    if choice:
        return {"choice": tuple(choice)}
    return {}


def _schema_text(value: str) -> str:
    """--json-schema's value: inline JSON text (it starts with '{'), else a file holding it."""
    text, where = value, "--json-schema"
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text()
        except OSError as e:
            raise UserError(
                f"--json-schema {value}: cannot read it ({e.strerror}); give a .json file or "
                "inline JSON text starting with '{'"
            ) from None
        where = f"--json-schema {value}"
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise UserError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise UserError(f"{where} must hold a JSON object (a schema), not {type(schema).__name__}")
    return json.dumps(schema, separators=(",", ":"))  # keys in order: see SamplingParams


def check_job_constraint(params: SamplingParams) -> None:
    """A UserError naming the flag if the job's constraint cannot be used (before any work)."""
    try:
        check_grammar(params)
    except ValueError as e:
        flag = next((_FLAGS[n] for n in FIELDS if getattr(params, n) is not None), "constraint")
        raise UserError(f"{flag}: {e}") from None


class GrammarChecks:
    """check_grammar once per distinct constraint: a million rows with one schema check it once
    (a JSON Schema check costs milliseconds). Bad constraints are remembered with their error."""

    MAX_KEPT = 4096  # distinct constraints remembered; past it, start afresh

    def __init__(self) -> None:
        self._seen: dict[tuple, str | None] = {}

    def __call__(self, params: SamplingParams) -> None:
        """ValueError (one line) if the params' constraint cannot be used."""
        key = (params.json_schema, params.regex, params.choice)
        if key not in self._seen:
            if len(self._seen) >= self.MAX_KEPT:
                self._seen.clear()
            try:
                check_grammar(params)
                self._seen[key] = None
            except ValueError as e:
                self._seen[key] = str(e)
        if (error := self._seen[key]) is not None:
            raise ValueError(error)


def response_format_fields(value: object) -> dict:
    """The constraint fields of a row's response_format (OpenAI's shape), all three set so that
    they replace the job's flags: {"type": "text"} is unconstrained, "json_object" any JSON
    object, "json_schema" the schema in value["json_schema"]["schema"]. The value may be JSON
    text (a Parquet string column). ValueError says what is wrong."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be an object with a type, got {type(value).__name__}")
    kind = value.get("type")
    if kind not in _TYPES:
        raise ValueError(f"type must be one of {', '.join(_TYPES)}, got {kind!r}")
    fields: dict = dict.fromkeys(FIELDS)
    if kind == "json_object":
        fields["json_schema"] = ANY_OBJECT
    elif kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ValueError(f"json_schema.schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ValueError('type json_schema needs {"json_schema": {"schema": {...}}}')
        fields["json_schema"] = schema
    return fields


def without_nulls(value: object) -> object:
    """value without null-valued keys, at any depth: what a row's response_format meant where a
    Parquet struct column gave it every key of every row, the missing ones null (io/tabular.py;
    so there `"const": null` must be written `"type": "null"`)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
