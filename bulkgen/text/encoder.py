"""Batch encoding of prompts, wrapped in the chat template or not, through the Rust tokenizer.

With a template, most of what gets tokenized is the template's fixed text (SmolLM2's system
prompt is longer than a typical prompt). The tokenizer cuts its input at added special tokens
and tokenizes the pieces between them independently, so the fixed text up to the prefix's last
special token, and from the suffix's first one, has the same ids in every row: those are
tokenized once, and only the piece around the prompt per row. Probes checked against a full
encode at start-up decide whether this holds for the tokenizer at hand (a Metaspace tokenizer
that prepends a space to the first piece only, say, fails them and gets full encodes).
"""

from __future__ import annotations

from bulkgen.text.template import PROBES, ChatTemplate


class PromptEncoder:
    def __init__(self, tokenizer, template: ChatTemplate | None) -> None:
        self._tokenizer = tokenizer
        self._template = template
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # Fixed ids before and after the per-row piece, and the fixed text inside that piece.
        self._split: tuple[list[int], str, str, list[int]] | None = None
        if template is not None and template.affix is not None and self._backend is not None:
            self._split = self._split_affix(*template.affix)

    def encode(self, prompts: list[str]) -> list[list[int]]:
        if self._split is not None:
            return self._encode_split(self._split, prompts)
        if self._template is None:
            return self._encode(prompts, add_special=True)
        # A chat template writes its own special tokens (BOS and the like).
        return self._encode(self._template.render(prompts), add_special=False)

    def encode_rendered(self, texts: list[str]) -> list[list[int]]:
        """Ids of texts a chat template rendered: they hold their own special tokens."""
        return self._encode(texts, add_special=False)

    def _encode(self, texts: list[str], add_special: bool) -> list[list[int]]:
        if self._backend is None:
            return self._tokenizer(texts, add_special_tokens=add_special)["input_ids"]
        encode = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=add_special)]

    def _split_affix(self, prefix: str, suffix: str):
        specials = [
            t.content
            for t in self._backend.get_added_tokens_decoder().values()
            if not (t.lstrip or t.rstrip or t.single_word) and t.content
        ]
        cut_prefix = max((prefix.rfind(s) + len(s) for s in specials if s in prefix), default=0)
        cut_suffix = min((suffix.find(s) for s in specials if s in suffix), default=len(suffix))
        head_text, before = prefix[:cut_prefix], prefix[cut_prefix:]
        after, tail_text = suffix[:cut_suffix], suffix[cut_suffix:]
        head = self._encode([head_text], add_special=False)[0] if head_text else []
        tail = self._encode([tail_text], add_special=False)[0] if tail_text else []
        split = (head, before, after, tail)
        full = self._encode([prefix + p + suffix for p in PROBES], add_special=False)
        return split if self._encode_split(split, list(PROBES)) == full else None

    def _encode_split(self, split, prompts: list[str]) -> list[list[int]]:
        head, before, after, tail = split
        middles = self._encode([before + p + after for p in prompts], add_special=False)
        return [head + ids + tail for ids in middles]
