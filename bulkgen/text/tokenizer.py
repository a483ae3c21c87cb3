"""Loading a model folder's tokenizer, and the token ids that end a generation."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

# Any one of these is enough for AutoTokenizer to build a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer.tiktoken")


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer (fast, Rust-backed where the format allows)."""
    folder = Path(model_dir)
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise ValueError(
            f"model folder {folder} has no tokenizer ({', '.join(_TOKENIZER_FILES)}): copy the "
            "tokenizer files of the model into it"
        )
    return AutoTokenizer.from_pretrained(folder, use_fast=True)


def eos_token_ids(model_dir: str | Path, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end a generation.

    generation_config.json is the authority when it names eos_token_id (an int or a list):
    chat models list every end token there (Llama 3.1: <|end_of_text|>, <|eom_id|>, <|eot_id|>)
    while a tokenizer names one. Without it, the tokenizer's eos. Empty when neither names one:
    generation then runs to max_tokens.
    """
    path = Path(model_dir) / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    return list(dict.fromkeys(int(i) for i in ids))
