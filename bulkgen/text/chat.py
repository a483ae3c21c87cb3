"""Conversations: a row's `messages` checked and rendered with the model's chat template.

A messages value is a list of {role, content} objects (content a string, or OpenAI-style text
parts). It is rendered with add_generation_prompt, so the model answers as the assistant; with
--system, a system message goes first unless the conversation starts with one.
"""

from __future__ import annotations


def checked_messages(value: object) -> list[dict]:
    """The messages as plain {role, content} dicts; ValueError saying what is wrong otherwise."""
    if not isinstance(value, list) or not value:
        kind = "an empty list" if value == [] else type(value).__name__
        raise ValueError(
            f"messages must be a non-empty list of {{role, content}} objects, not {kind}"
        )
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"message {i} is not a {{role, content}} object with a string role")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: the text ones, joined
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise ValueError(f"message {i}: only text content parts are supported")
            content = "".join(texts)
        if not isinstance(content, str):
            raise ValueError(f"message {i} has no string content")
        role = message["role"]
        # OpenAI's "developer" role stands where "system" did; chat templates know only the latter.
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def with_system(messages: list[dict], system: str | None) -> list[dict]:
    if system is None or messages[0]["role"] == "system":
        return messages
    return [{"role": "system", "content": system}, *messages]


class Conversations:
    """Renders checked conversations to the text the model reads."""

    def __init__(self, tokenizer, system: str | None) -> None:
        self._tokenizer = tokenizer
        self.system = system
        self.has_template = bool(getattr(tokenizer, "chat_template", None))

    def render(self, messages: list[dict]) -> str:
        """ValueError if there is no template or it fails on these messages."""
        if not self.has_template:
            raise ValueError("the model has no chat template to render messages with")
        try:
            return self._tokenizer.apply_chat_template(
                with_system(messages, self.system), tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # a template may raise anything (e.g. on role order)
            raise ValueError(f"the chat template fails on these messages: {e}") from e


def use_chat_template(tokenizer, text: str, system: str | None = None) -> None:
    """Make `text` (a --chat-template-file's Jinja) the tokenizer's chat template, as vLLM's
    --chat-template does; a UserError, before any row, if it does not parse or cannot render a
    user message (after `system`, the job's --system, as every row has it) with its content (a
    template may still refuse some conversations: those rows' errors)."""
    from jinja2 import TemplateSyntaxError

    from bulkgen.errors import UserError

    tokenizer.chat_template = text
    # Not a word a template's own text may hold ("hi" is in "<think>"): only the content has it.
    probe = "bulkgen-probe-7f3a"
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": probe})
    try:
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    except TemplateSyntaxError as e:
        raise UserError(f"--chat-template-file line {e.lineno}: {e.message}") from e
    except Exception as e:  # noqa: BLE001 - a template may raise anything
        what = "a one-message chat" if system is None else "a --system and a user message"
        raise UserError(f"--chat-template-file fails on {what}: {e}") from e
    if not isinstance(rendered, str) or probe not in rendered:
        raise UserError("--chat-template-file renders a user message without its content")
