"""Wrap plain prompts as a user message with the model's chat template, fast.

Rendering a Jinja template per row costs tens of microseconds. Most templates place the message
content verbatim between a fixed prefix and suffix; when probes with awkward contents confirm
that, rendering is string concatenation. Otherwise every row goes through the template.
"""

from __future__ import annotations

from bulkgen.errors import UserError

_SENTINEL = "\x00bulkgen-content\x00"
# Contents that a template which alters or inspects its content would likely render differently.
PROBES = ("hello", "  two  spaces  ", "\nnew\nlines\n", "{{ x }} {% y %}", "ünï \t cödé", "12 + 3")


class ChatTemplate:
    def __init__(self, tokenizer, system: str | None = None) -> None:
        self._tokenizer = tokenizer
        self._system = system  # --system: a system message before each prompt
        try:
            rendered = self._render_one(_SENTINEL)
        except Exception as e:  # a template may raise anything; the user can only opt out
            raise UserError(
                f"the model's chat template fails on a user message ({e}); "
                "pass --no-chat-template to send prompts as they are"
            ) from e
        # (prefix, suffix) when every prompt renders as prefix + prompt + suffix.
        self.affix: tuple[str, str] | None = None
        if rendered.count(_SENTINEL) == 1:
            prefix, suffix = rendered.split(_SENTINEL)
            if all(self._render_one(p) == prefix + p + suffix for p in PROBES):
                self.affix = (prefix, suffix)

    def _render_one(self, content: str) -> str:
        messages = [{"role": "user", "content": content}]
        if self._system is not None:
            messages.insert(0, {"role": "system", "content": self._system})
        return self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def render(self, prompts: list[str]) -> list[str]:
        if self.affix is None:
            return [self._render_one(p) for p in prompts]
        prefix, suffix = self.affix
        return [prefix + p + suffix for p in prompts]
