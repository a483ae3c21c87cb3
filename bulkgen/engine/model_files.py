"""Where an engine's model comes from: the device, the model folder (a path, a Hub id or an
alias), the end-of-sequence ids its files declare, and the sampling its generation config
recommends."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):  # torch.device took "tpu" to a traceback
        raise ValueError(f"device must be cuda, cuda:N, cpu or auto, got {name!r}")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but no CUDA device is available")
    return device


def model_dir(name: str) -> Path:
    """A local model folder: the path itself, or a Hub id or alias resolved to its download."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    from bulkgen.model.hub import resolve_model  # the Hub and aliases only when needed

    return resolve_model(name)


def read_eos_ids(model_dir: Path | None, mcfg_dict: dict) -> list[int]:
    """End-of-sequence ids: generation_config.json's (it may list several: Llama 3.1's
    <|end_of_text|>, <|eom_id|>, <|eot_id|>), else config.json's, and the tokenizer's own end
    token beside them, as vLLM stops at it too: a chat fine-tune whose tokenizer ends its turns
    with <|im_end|> while its configs name </s> ran every row to max_tokens."""
    ids = []
    candidates = []
    if model_dir is not None and (model_dir / "generation_config.json").is_file():
        candidates.append(json.loads((model_dir / "generation_config.json").read_text()))
    candidates.append(mcfg_dict)
    for source in candidates:
        eos = source.get("eos_token_id")
        if eos is not None:
            ids = [eos] if isinstance(eos, int) else list(eos)
            break
    if (own := tokenizer_eos_id(model_dir)) is not None:
        ids.append(own)
    return list(dict.fromkeys(int(i) for i in ids))


def tokenizer_eos_id(model_dir: Path | None) -> int | None:
    """The id of the end token tokenizer_config.json names (eos_token), looked up in its
    added tokens or tokenizer.json's; None where the files do not say."""
    if model_dir is None or not (model_dir / "tokenizer_config.json").is_file():
        return None
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if not isinstance(eos, str):
        return None
    for token_id, token in (config.get("added_tokens_decoder") or {}).items():
        if isinstance(token, dict) and token.get("content") == eos:
            return int(token_id)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    tokenizer = json.loads(path.read_text())
    for token in tokenizer.get("added_tokens") or []:
        if token.get("content") == eos:
            return int(token["id"])
    vocab = (tokenizer.get("model") or {}).get("vocab")
    found = vocab.get(eos) if isinstance(vocab, dict) else None
    return found if isinstance(found, int) else None


# generation_config.json's sampling fields that vLLM (generation_config="auto") takes as its
# default SamplingParams, under bulkgen's names (max_new_tokens is max_tokens), with transformers'
# GenerationConfig defaults, which vLLM leaves out (its to_diff_dict): a file's "top_k": 50 is
# no choice of the model's.
_GENERATION_DEFAULTS = {
    "temperature": ("temperature", 1.0),
    "top_p": ("top_p", 1.0),
    "top_k": ("top_k", 50),
    "min_p": ("min_p", None),
    "repetition_penalty": ("repetition_penalty", 1.0),
    "max_new_tokens": ("max_tokens", None),
}


def generation_defaults(model_dir: Path | None) -> dict:
    """The SamplingParams fields the model's generation_config.json sets to other values than
    transformers' defaults, as vLLM reads them for a call without sampling parameters; {}
    without that file."""
    path = None if model_dir is None else Path(model_dir) / "generation_config.json"
    if path is None or not path.is_file():
        return {}
    config = json.loads(path.read_text())
    return {
        ours: config[hf]
        for hf, (ours, default) in _GENERATION_DEFAULTS.items()
        if config.get(hf) is not None and config[hf] != default
    }


def model_context(asked: int | None, limit: int) -> int:
    """The context a sequence gets: max_model_len where given, the model's positions
    (max_position_embeddings) at most; asked past them, a warning says so (it was cut silently,
    and a user who asked for 100,000 on a 512-position model never heard)."""
    if asked is not None and asked > limit:
        log.warning(
            "max_model_len %d is more than the model's %d positions: sequences end at %d",
            asked, limit, limit,
        )  # fmt: skip
    return min(asked or limit, limit)
