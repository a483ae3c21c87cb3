"""Loading a model folder's tokenizer (the ids that end a generation: engine/model_files.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

# Any one of these is enough for AutoTokenizer to build a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer.tiktoken")


# transformers' tokenizer notices that a bulkgen user cannot act on (bulkgen loads and decodes
# the tokenizer, not them): about `fix_mistral_regex` for folders whose config.json does not
# say which model it is, and `clean_up_tokenization_spaces` ignored for BPE tokenizers. Only
# these messages, only from transformers' tokenizer modules, are dropped.
_UNACTIONABLE = ("fix_mistral_regex", "clean_up_tokenization_spaces")
_TOKENIZER_LOGGERS = (
    "transformers.tokenization_utils_tokenizers",
    "transformers.tokenization_utils_base",
    "transformers.tokenization_utils_fast",
)


class _DropUnactionable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(word in message for word in _UNACTIONABLE)


def silence_unactionable_warnings() -> None:
    for name in _TOKENIZER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropUnactionable) for f in logger.filters):
            logger.addFilter(_DropUnactionable())


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer (fast, Rust-backed where the format allows)."""
    silence_unactionable_warnings()
    folder = Path(model_dir)
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise ValueError(
            f"model folder {folder} has no tokenizer ({', '.join(_TOKENIZER_FILES)}): copy the "
            "tokenizer files of the model into it"
        )
    return AutoTokenizer.from_pretrained(folder, use_fast=True)
