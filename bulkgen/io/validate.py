"""What the reader checks of each row's values, so that nothing a row holds can fail a later stage.

A row's carried values (prompt, messages, template columns, kept columns, parameters) must nest at
most MAX_DEPTH levels and hold only text that encodes as UTF-8 (no lone surrogates, which JSON's
`\\ud800` escapes can produce); its parameters must make valid SamplingParams. A value that fails
makes the row an error record naming the field. An error record's own values are made writable
(writable()): unencodable characters become backslash escapes.
"""

from __future__ import annotations

import dataclasses

from bulkgen.config import SamplingParams
from bulkgen.engine.grammar import check_grammar
from bulkgen.row import Row, checked_overrides
from bulkgen.structured import GrammarChecks

# Deeper values are refused: the writers (json, pyarrow) and templates recurse over them.
MAX_DEPTH = 32
_SHOWN_CHARS = 40
# Values that always travel: a list of them (a prompt of token ids, 1,000 a row in `trt`) is
# passed at C speed instead of one interpreted step per element, which held 1,000 such rows for
# 0.52 s on a 2-core CPU (19 ms now) before the engine's first step.
_PLAIN = frozenset({int, float, bool, type(None)})


def shown(value: object) -> str:
    """A short printable form of a value for an error message (repr escapes surrogates)."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def problem(value: object) -> str | None:
    """Why a value cannot travel through the pipeline, or None. Iterative: any depth is safe."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"holds {item[e.start]!r} at character {e.start}, which is not valid UTF-8"
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return f"nests deeper than {MAX_DEPTH} levels"
            if not isinstance(item, dict) and _PLAIN.issuperset(map(type, item)):
                continue  # token ids and other plain numbers: nothing in them to check
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None


def writable(value: object) -> object:
    """The value with unencodable characters as backslash escapes, and None past MAX_DEPTH."""
    if problem(value) is None:
        return value
    return _escaped(value, 0)


def _escaped(value: object, depth: int) -> object:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if depth >= MAX_DEPTH and isinstance(value, dict | list | tuple):
        return None
    if isinstance(value, dict):
        return {_escaped(k, depth + 1): _escaped(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v, depth + 1) for v in value]
    return value


def checked_id(value: object, default: str) -> tuple[str, str | None]:
    """The row id for an id column's value (default when null), and what is wrong with it.

    A bad id (not a string or integer, empty, not valid UTF-8) gives the row its default id
    `<file>:<row>`, so that its error record is still found by its row number.
    """
    if value is None:
        return default, None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), None
    if not isinstance(value, str):
        return default, f"id is {type(value).__name__} {shown(value)}, not a string or an integer"
    if not value:
        return default, "id is empty"
    if (bad := problem(value)) is not None:
        return default, f"id {shown(value)} {bad}"
    return value, None


def check_row(row: Row, grammar_checks: GrammarChecks | None = None) -> None:
    """Fail the row, naming the field, if a value it carries cannot go through the pipeline.
    grammar_checks: the reader's cache of checked response_format constraints."""
    if row.error is None:
        fields = {"prompt": row.prompt, "messages": row.messages}
        fields.update({f"column {k!r}": v for k, v in (row.columns or {}).items()})
        fields.update({f"column {k!r}": v for k, v in (row.extra or {}).items()})
        fields.update({f"column {k!r}": v for k, v in (row.overrides or {}).items()})
        for name, value in fields.items():
            if (bad := problem(value)) is not None:
                row.fail(f"{name} {bad}")
                break
    if row.error is None and row.overrides:
        try:
            params = dataclasses.replace(SamplingParams(), **checked_overrides(row.overrides))
        except (ValueError, TypeError) as e:
            row.fail(f"bad sampling parameter: {e}")
        else:
            if "response_format" in row.overrides and params.constrained:
                try:
                    (grammar_checks or check_grammar)(params)
                except ValueError as e:
                    row.fail(f"bad sampling parameter: column 'response_format': {e}")
    if row.error is not None:
        as_record(row)


def as_record(row: Row) -> None:
    """A failed row reduced to what its error record writes, made writable; the rest dropped. A
    text prompt stays in the record's prompt column, to show which row failed."""
    if isinstance(row.prompt, str) and row.prompt_text is None:
        row.prompt_text = writable(row.prompt)
    row.prompt = row.messages = row.columns = row.overrides = None
    if row.extra is not None:
        row.extra = {k: writable(v) for k, v in row.extra.items()}
