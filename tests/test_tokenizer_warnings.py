"""transformers' tokenizer notices a user cannot act on are dropped; other warnings are not."""

from __future__ import annotations

import logging

from bulkgen.text.tokenizer import load_tokenizer

NAME = "transformers.tokenization_utils_tokenizers"


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_unactionable_tokenizer_notices_are_dropped_and_others_kept(tiny_model_dir):
    load_tokenizer(tiny_model_dir)
    logger = logging.getLogger(NAME)  # transformers' loggers do not propagate to the root
    seen = Collect()
    logger.addHandler(seen)
    try:
        logger.warning("You should set the `fix_mistral_regex=True` flag when loading this")
        logger.warning("Ignoring clean_up_tokenization_spaces=True for BPE tokenizer X.")
        logger.warning("something else a user should see")
    finally:
        logger.removeHandler(seen)
    assert seen.messages == ["something else a user should see"]
