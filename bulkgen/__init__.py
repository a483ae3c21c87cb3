"""bulkgen: offline bulk generation for LLMs.

The public names load lazily, so `bulkgen --help` and the pipeline's light modules do not pay
for importing torch.
"""

from __future__ import annotations

import importlib

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

_HOMES = {
    "LLM": "bulkgen.llm",
    "EngineConfig": "bulkgen.config",
    "SamplingParams": "bulkgen.config",
    "RequestOutput": "bulkgen.engine.request",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'bulkgen' has no attribute {name!r}")
