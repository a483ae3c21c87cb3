"""--prompt-template: each row's prompt rendered from its input columns with a Jinja template.

The template sees the row's columns as variables. A column the row lacks, or holds null in, is
undefined, and an undefined variable is an error (StrictUndefined): a prompt with a silent gap in
it is worse than an error record. `{{ x | default('') }}` or `{% if x is defined %}` opt out.
Rendering happens in the tokenizer stage, before the chat template wraps the rendered text as it
wraps any prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jinja2 import StrictUndefined, TemplateSyntaxError, meta
from jinja2.sandbox import SandboxedEnvironment

from bulkgen.errors import UserError
from bulkgen.row import Row


def template_source(value: str) -> str:
    """The template text of a --prompt-template value: `@path` reads the file, else the value."""
    if not value.startswith("@"):
        return value
    path = Path(value[1:]).expanduser()
    try:
        return path.read_text()
    except OSError as e:
        raise UserError(f"cannot read the --prompt-template file {path}: {e.strerror}") from e


def chat_template_text(path: str | None) -> str | None:
    """The Jinja text of a --chat-template-file (None without one)."""
    if path is None:
        return None
    file = Path(path).expanduser()
    try:
        return file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not UTF-8 text"
        raise UserError(f"cannot read the --chat-template-file {file}: {why}") from e


class PromptTemplate:
    def __init__(self, source: str) -> None:
        # Sandboxed: a template from a shared recipe should not reach Python internals.
        env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
        try:
            self._template = env.from_string(source)
            variables = meta.find_undeclared_variables(env.parse(source))
        except TemplateSyntaxError as e:
            raise UserError(f"--prompt-template line {e.lineno}: {e.message}") from e
        # The only columns a row's rendering can look at: the reader reads just these.
        self.variables: tuple[str, ...] = tuple(sorted(variables))

    def render(self, columns: dict) -> str:
        return self._template.render(columns)


class RenderPrompts:
    """The tokenizer stage's first step: fill each row's prompt from its columns, then `then`."""

    def __init__(self, template: PromptTemplate, then: Callable[[list[Row]], None]) -> None:
        self.template = template
        self.then = then

    def __call__(self, rows: list[Row]) -> None:
        for row in rows:
            if row.error is not None:
                continue
            columns = {k: v for k, v in (row.columns or {}).items() if v is not None}
            try:
                row.prompt = self.template.render(columns)
            except Exception as e:  # a template can raise anything; it is this row's problem
                row.fail(f"--prompt-template failed: {e}")
        self.then(rows)
