"""SamplingParams' structured-output fields checked and made canonical (config.py)."""

from __future__ import annotations

import json


def check_constraint(params) -> None:
    """json_schema (text or a dict) as compact JSON text, choice as a tuple; ValueError for a bad
    value or more than one of json_schema, regex and choice."""
    schema = params.json_schema
    if schema is not None:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise ValueError(f"invalid JSON schema: not JSON ({e})") from None
        if not isinstance(schema, dict):
            kind = type(schema).__name__
            raise ValueError(f"invalid JSON schema: must be a JSON object, got a {kind}")
        # Compact, keys in their given order: the grammar writes an object's properties in
        # the schema's order, so sorting them would change the output (answer before
        # question); two schemas that differ only in key order generate differently.
        try:
            canonical = json.dumps(schema, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:  # a set, bytes, NaN inside: no JSON spells it
            raise ValueError(f"invalid JSON schema: {e}") from None
        object.__setattr__(params, "json_schema", canonical)
    if params.regex is not None and not isinstance(params.regex, str):
        raise ValueError(f"regex must be a string, got {params.regex!r}")
    if params.choice is not None:
        choice = params.choice
        choice = (choice,) if isinstance(choice, str) else tuple(choice) if _listed(choice) else ()
        if not choice or not all(isinstance(c, str) and c for c in choice):
            raise ValueError(f"choice must be a list of non-empty strings, got {params.choice!r}")
        object.__setattr__(params, "choice", choice)
    given = [n for n in ("json_schema", "regex", "choice") if getattr(params, n) is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of json_schema, regex and choice, got {given}")


def _listed(value) -> bool:
    """A list or tuple of choices (not a number, a mapping, bytes, or a set, whose order, and so
    a rerun's recorded choice, would change from one process to the next)."""
    return isinstance(value, list | tuple)
