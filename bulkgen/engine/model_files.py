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
    """End-of-sequence ids: generation_config.json first (it may list several), then config."""
    candidates = []
    if model_dir is not None and (model_dir / "generation_config.json").is_file():
        candidates.append(json.loads((model_dir / "generation_config.json").read_text()))
    candidates.append(mcfg_dict)
    for source in candidates:
        eos = source.get("eos_token_id")
        if eos is not None:
            return [eos] if isinstance(eos, int) else list(eos)
    return []


# generation_config.json's sampling fields that vLLM (generation_config="auto") takes as its
# default SamplingParams, under bulkgen's names: max_new_tokens is max_tokens.
_GENERATION_DEFAULTS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def generation_defaults(model_dir: Path | None) -> dict:
    """The SamplingParams fields the model's generation_config.json sets (those not null), as
    vLLM reads them for a call without sampling parameters; {} without that file."""
    path = None if model_dir is None else Path(model_dir) / "generation_config.json"
    if path is None or not path.is_file():
        return {}
    config = json.loads(path.read_text())
    return {
        ours: config[hf] for hf, ours in _GENERATION_DEFAULTS.items() if config.get(hf) is not None
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
