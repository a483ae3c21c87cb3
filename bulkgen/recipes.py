"""Recipes: a YAML file whose fields are `bulkgen run`'s options, for jobs that are run again.

    bulkgen run --recipe recipes/nightly-eval.yaml [INPUT...] [flags]

A field is a flag's long name with underscores (`max_tokens`, `keep_columns`, `prompt_template`),
or `inputs` (`input`) for the INPUT arguments. The names come from the click command itself, so
every option of `bulkgen run` works in a recipe with no change here. The recipe's values become
the command's defaults (click's default_map): a flag on the command line overrides its field.
Relative paths in a recipe (inputs, out, a `@file` prompt template, a model folder, a JSON
schema file, a score baseline or references file) are relative to the recipe's folder; a
`json_schema` field may also hold the schema itself as a YAML mapping. Two fields are the
recipe's own: `description` (free text) and `score` (`{reference_column, baseline,
references}`: score the results when the run ends).
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import click
import yaml

from bulkgen.errors import UserError

_META = "bulkgen.recipe"
_SCORE_FIELDS = ("reference_column", "baseline", "references")
_RECIPE_FIELDS = ("description", "score")
_NOT_FIELDS = ("recipe", "help")


@dataclass(frozen=True)
class Recipe:
    path: Path
    options: dict  # click parameter name -> value, as click's default_map takes them
    score: dict | None = None  # {"reference_column": ..., "baseline"/"references": ... or None}
    description: str | None = None


def _field_names(command: click.Command) -> dict[str, click.Parameter]:
    """Recipe field name -> the run command's parameter it sets."""
    names: dict[str, click.Parameter] = {}
    for param in command.params:
        if param.name in _NOT_FIELDS or not param.expose_value:
            continue
        if isinstance(param, click.Argument):
            names[param.name] = param
            names[param.name.rstrip("s")] = param  # `input` for `inputs`
            continue
        long = [o for o in param.opts if o.startswith("--")]
        if long:
            names[long[0][2:].replace("-", "_")] = param
    return names


def load_recipe(path: str | Path, command: click.Command) -> Recipe:
    """Read and check a recipe for `command`; a UserError names the bad field and the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"cannot read recipe {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise UserError(f"recipe {path} is not UTF-8 text ({e.reason} at byte {e.start})") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(
            f"recipe {path} is not valid YAML{where}: {getattr(e, 'problem', e)}"
        ) from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"recipe {path} must be a mapping of field: value, not a YAML list or text")
    params = _field_names(command)
    options: dict = {}
    for name, value in data.items():
        if name in _RECIPE_FIELDS or value is None:  # null: the field is not set
            continue
        param = params.get(name)
        if param is None:
            close = difflib.get_close_matches(str(name), [*params, *_RECIPE_FIELDS], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserError(
                f"recipe {path}: unknown field {name!r}{hint}; fields are the `bulkgen run` flags "
                "with underscores (max_tokens, keep_columns, ...), inputs, description and score"
            )
        if param.name in options:
            raise UserError(f"recipe {path}: field {name!r} is given twice")
        options[param.name] = _value(path, name, param, value, command)
    return Recipe(path, options, _score(path, data.get("score")), data.get("description"))


def _value(path: Path, name: str, param: click.Parameter, value, command: click.Command):
    many = param.multiple or param.nargs == -1
    if name == "json_schema" and isinstance(value, dict):  # the schema itself, as YAML
        value = json.dumps(value)
    elif name == "json_schema" and isinstance(value, str) and (path.parent / value).exists():
        value = _near(path, value)  # a schema file beside the recipe; else inline JSON
    if isinstance(value, list) and not many:
        if name != "keep_columns":
            raise UserError(f"recipe {path}: field {name!r} takes one value, not a list")
        value = ",".join(str(v) for v in value)  # keep_columns: [a, b] -> "a,b"
    if many:
        value = list(value) if isinstance(value, list | tuple) else [value]
    for item in value if many else [value]:
        if isinstance(item, dict | list | tuple) or item is None:
            shown = "null" if item is None else type(item).__name__
            raise UserError(f"recipe {path}: field {name!r} takes text or a number, not {shown}")
    if name == "choice" and any(isinstance(v, bool) for v in value):
        raise UserError(
            f"recipe {path}: field 'choice': YAML reads yes/no/on/off as true/false; quote the "
            "strings: choice: ['yes', 'no']"
        )
    if isinstance(param.type, click.types.IntParamType | click.types.FloatParamType):
        for number in value if many else [value]:
            _check_number(path, name, param.type, number)
    if name in ("inputs", "input", "out"):
        value = [_near(path, v) for v in value] if many else _near(path, value)
    elif name == "prompt_template" and isinstance(value, str) and value.startswith("@"):
        value = "@" + _near(path, value[1:])
    elif name == "chat_template_file" and isinstance(value, str):
        value = _near(path, value)
    elif name == "model" and isinstance(value, str) and (path.parent / value).exists():
        value = _near(path, value)  # a model folder beside the recipe; else an alias or Hub id
    try:
        with click.Context(command) as ctx:
            param.type_cast_value(ctx, value)
    except click.BadParameter as e:
        raise UserError(f"recipe {path}: field {name!r}: {e.message}") from e
    except (TypeError, ValueError) as e:
        raise UserError(f"recipe {path}: field {name!r}: {value!r} is not a valid value") from e
    return value


def _check_number(path: Path, name: str, kind: click.ParamType, value) -> None:
    """YAML reads a number as one, which click's int() would truncate (seed: 1.5 runs seed 1),
    and true/false as bools, which it takes as 1 and 0: both refused, as the command line refuses
    --seed 1.5, --seed 2.0 and --seed true."""
    if isinstance(value, bool):
        raise UserError(f"recipe {path}: field {name!r}: {str(value).lower()} is not a number")
    if isinstance(value, float) and isinstance(kind, click.types.IntParamType):
        whole = f" (write {int(value)})" if value.is_integer() else ""
        raise UserError(f"recipe {path}: field {name!r}: {value} is not an integer{whole}")


def _near(recipe: Path, value) -> str:
    value = os.path.expanduser(str(value))
    return value if os.path.isabs(value) else os.path.normpath(recipe.parent / value)


def _score(path: Path, section) -> dict | None:
    if section is None or section is False:
        return None
    if section is True:
        section = {}
    if not isinstance(section, dict):
        raise UserError(f"recipe {path}: field 'score' must be a mapping: score: {{...}}")
    unknown = [k for k in section if k not in _SCORE_FIELDS]
    if unknown:
        raise UserError(
            f"recipe {path}: unknown field 'score.{unknown[0]}'; score takes "
            f"{', '.join(_SCORE_FIELDS)}"
        )
    baseline, references = section.get("baseline"), section.get("references")
    return {
        "reference_column": str(section.get("reference_column") or "answer"),
        "baseline": None if baseline is None else _near(path, baseline),
        "references": None if references is None else _near(path, references),
    }


def use_recipe(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """The --recipe callback (eager: it runs before the other options are read)."""
    if value is None:
        return
    try:
        recipe = load_recipe(value, ctx.command)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        ctx.exit(1)
    ctx.default_map = {**(ctx.default_map or {}), **recipe.options}
    ctx.meta[_META] = recipe


def check_score(ctx: click.Context, keep_columns: tuple[str, ...], fmt: str = "parquet") -> None:
    """A UserError before any work if the recipe's score could not run once the run ends."""
    recipe: Recipe | None = ctx.meta.get(_META)
    if recipe is None or recipe.score is None:
        return
    column, references = recipe.score["reference_column"], recipe.score["references"]
    if references is None and fmt == "openai":
        raise UserError(
            f"recipe {recipe.path}: score reads the reference column {column!r} from the "
            "results, and --format openai lines keep no column: name a score.references file"
        )
    if references is None and column not in keep_columns:
        raise UserError(
            f"recipe {recipe.path}: score reads the reference column {column!r} from the "
            "results, and the run does not keep it: add it to keep_columns, or name a "
            "score.references file"
        )
    if references is not None and not os.path.isfile(references):
        raise UserError(f"recipe {recipe.path}: score.references {references} is not a file")
    baseline = recipe.score["baseline"]
    if baseline is not None and not os.path.isdir(baseline):
        raise UserError(f"recipe {recipe.path}: score.baseline {baseline} is not a folder")


def after_run(ctx: click.Context, out: str, quiet: bool) -> None:
    """What the recipe asks for once the run has ended: its score, written into stats.json."""
    recipe: Recipe | None = ctx.meta.get(_META)
    if recipe is None or recipe.score is None:
        return
    from bulkgen.score import score_folder, summary

    score = recipe.score
    section = score_folder(out, score["reference_column"], score["baseline"], score["references"])
    if not quiet:
        for line in summary(section):
            click.echo(line, err=True)
