"""bulkgen: offline bulk generation for LLMs."""

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.request import RequestOutput
from bulkgen.llm import LLM

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
