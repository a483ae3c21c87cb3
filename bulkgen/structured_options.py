"""The structured-output options of `bulkgen run` (at most one of them): run_options.py lists
them with the others; structured.py reads their values."""

from __future__ import annotations

import click

STRUCTURED_OPTIONS = [
    click.option(
        "--json-schema",
        metavar="FILE_OR_JSON",
        default=None,
        help="Make every completion a JSON value valid under this JSON Schema: a .json file, or "
        'inline JSON text (\'{"type": "object", ...}\'). A row\'s response_format column '
        "overrides it for that row.",
    ),
    click.option(
        "--json",
        "json_object",
        is_flag=True,
        default=False,
        help="Make every completion a JSON object, any keys (--json-schema "
        '\'{"type": "object"}\').',
    ),
    click.option(
        "--regex",
        metavar="PATTERN",
        default=None,
        help="Make every completion match this regular expression in full.",
    ),
    click.option(
        "--choice",
        multiple=True,
        metavar="STR",
        help="Make every completion exactly one of these strings. Repeatable: --choice yes "
        "--choice no.",
    ),
]
