"""A structured-output constraint checked before any work: does the JSON schema read as a schema,
does the regex compile. A stand-in for the engine's check (bulkgen.engine.grammar.check_grammar,
which compiles the grammar itself); the same signature, so callers switch by import."""

from __future__ import annotations

import json
import re

from bulkgen.config import SamplingParams


def check_grammar(params: SamplingParams) -> None:
    """Raise ValueError (one line naming the problem) if the params' constraint cannot be used;
    its messages start as the engine's do ("invalid JSON schema: ...", "invalid regex: ...")."""
    if params.json_schema is not None:
        _check_schema(json.loads(params.json_schema))  # SamplingParams made it canonical JSON
    if params.regex is not None:
        try:
            re.compile(params.regex)
        except re.error as e:
            raise ValueError(f"invalid regex: {e} in {params.regex!r}") from None
    if params.choice is not None and not all(isinstance(c, str) and c for c in params.choice):
        raise ValueError(f"choice must be a list of non-empty strings, got {params.choice!r}")


def _check_schema(schema: dict) -> None:
    try:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for
    except ImportError:  # an optional check: the object shape was checked by SamplingParams
        return
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path) or "the top level"
        message = f"invalid JSON schema: {e.message} (at {where})"
        raise ValueError(message) from None
