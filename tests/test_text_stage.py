"""Tokenizer stage: the same ids as transformers' apply_chat_template, however it gets them."""

from __future__ import annotations

import pytest

from bulkgen.row import Row
from bulkgen.text.encoder import PromptEncoder
from bulkgen.text.stage import Detokenize, Tokenize
from bulkgen.text.template import ChatTemplate

CONTENTS = [
    "What is the capital of France?",
    " leading space",
    "trailing newline\n",
    "\n\nstarts with newlines",
    "inner <|user|> special and </s> end",
    "digits 0123456789 and ünïcödé",
    "x",
]
SYSTEM_TEMPLATE = (
    "{% for m in messages %}<|system|>You are a quick brown fox.</s>\n<|{{ m['role'] }}|>\n"
    "{{ m['content'] }}</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def reference(tokenizer, content):
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=True, add_generation_prompt=True
    )["input_ids"]


@pytest.fixture
def system_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = SYSTEM_TEMPLATE
    return tokenizer


def test_template_text_around_special_tokens_is_tokenized_once(system_tokenizer):
    encoder = PromptEncoder(system_tokenizer, ChatTemplate(system_tokenizer))
    head, before, after, tail = encoder._split
    assert before == "\n" and after == "" and "fox" not in before
    assert encoder.encode(CONTENTS) == [reference(system_tokenizer, c) for c in CONTENTS]


def test_without_the_shortcut_the_ids_are_the_same(system_tokenizer):
    encoder = PromptEncoder(system_tokenizer, ChatTemplate(system_tokenizer))
    encoder._split = None
    assert encoder.encode(CONTENTS) == [reference(system_tokenizer, c) for c in CONTENTS]


def test_plain_prompts_get_the_tokenizers_special_tokens(tiny_tokenizer):
    encoder = PromptEncoder(tiny_tokenizer, None)
    assert encoder.encode(CONTENTS) == [tiny_tokenizer(c)["input_ids"] for c in CONTENTS]


def test_tokenize_fills_ids_and_detokenize_fills_text(tiny_tokenizer):
    rows = [Row("a", "Hello"), Row("b", [5, 6]), Row("c", "")]
    Tokenize(tiny_tokenizer, chat_template=True, vocab_size=len(tiny_tokenizer))(rows)
    assert rows[0].prompt_ids == reference(tiny_tokenizer, "Hello")
    assert rows[1].prompt_ids == [5, 6] and rows[1].prompt_text is None
    assert rows[2].error == "prompt is empty"
    rows[0].token_ids = tiny_tokenizer("Paris is nice.")["input_ids"] + [
        tiny_tokenizer.eos_token_id
    ]
    Detokenize(tiny_tokenizer)(rows)
    assert rows[0].text == "Paris is nice."  # the end token is not part of the text
    assert rows[1].prompt_text == tiny_tokenizer.decode([5, 6])
    assert rows[2].text is None
