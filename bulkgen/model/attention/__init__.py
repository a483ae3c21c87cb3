"""Attention backends: `torch` (reference, CPU) and `triton` (the GPU path)."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

BACKENDS = {
    "torch": "bulkgen.model.attention.torch_backend",
    "triton": "bulkgen.model.attention.triton_backend",
}


def get_backend(name: str, device: torch.device) -> ModuleType:
    """The module providing write_kv and paged_attention for this device."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name])
