"""LLM: the Python entry point. Prompts (text or token ids) in, outputs in input order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.engine import Engine
from bulkgen.engine.request import RequestOutput


class LLM:
    """Offline generation over a continuous-batching engine.

    >>> llm = LLM("path/to/model", dtype="float32", device="cpu")
    >>> outs = llm.generate(["Hello"], SamplingParams(max_tokens=16, temperature=0.0))
    """

    def __init__(self, model: str, **engine_kwargs) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = set(engine_kwargs) - known
        if unknown:
            raise ValueError(f"unknown LLM option(s): {', '.join(sorted(unknown))}")
        self.engine = Engine(EngineConfig(model=model, **engine_kwargs))
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None and self.engine.model_dir is not None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.engine.model_dir)
        return self._tokenizer

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]] | str,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(
                f"{len(sampling_params)} SamplingParams given for {len(prompts)} prompts"
            )
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params, strict=True)):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            self.engine.add(str(i), ids, params)
        outputs: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                outputs[out.request_id] = out
        ordered = [outputs[str(i)] for i in range(len(prompts))]
        if self.tokenizer is not None:
            for out in ordered:
                out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        return ordered
