"""Where an engine's model comes from: the device, the model folder (a path, a Hub id or an
alias), and the end-of-sequence ids its files declare."""

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
