"""LLM: the Python entry point. Prompts (text or token ids) in, outputs in input order."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import fields, replace

from bulkgen.config import EngineConfig, SamplingParams, _is_int
from bulkgen.engine.engine import Engine
from bulkgen.engine.model_files import generation_defaults
from bulkgen.engine.request import RequestOutput
from bulkgen.samples import sample_seed
from bulkgen.text.chat import checked_messages
from bulkgen.text.stop import cut_at_stop, keep_first_tokens, kept_token_counts

_STOP_CONTEXT = 16  # earlier tokens re-decoded with each step's new ones when watching stops


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
        self.engine: Engine | None = Engine(EngineConfig(model=model, **engine_kwargs))
        self._model_dir = self.engine.model_dir
        self._tokenizer = None
        self._calls = 0  # generate() calls: their requests' ids begin with it
        self._lock = threading.Lock()  # one generate() at a time: the engine is one loop

    def close(self) -> None:
        """End the engine and let its memory go (weights, KV cache, graphs: back to the device as
        soon as nothing else holds them, at the latest when the next engine loads); with
        tensor_parallel > 1, stop its other ranks' processes (they also end by themselves when
        this process does). Calls after it raise; closing again does nothing."""
        with self._lock:  # a generate() running in another thread ends first
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.engine is None:
            raise RuntimeError("this LLM is closed: make a new one")

    @property
    def tokenizer(self):
        if self._tokenizer is None and self._model_dir is not None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._model_dir)
        return self._tokenizer

    def default_sampling_params(self) -> SamplingParams:
        """What generate() and chat() sample with when given no SamplingParams: the fields the
        model's generation_config.json sets (temperature, top_p, top_k, min_p,
        repetition_penalty, max_new_tokens as max_tokens), as vLLM's
        LLM.get_default_sampling_params() does; SamplingParams() for the rest."""
        return SamplingParams(**generation_defaults(self._model_dir))

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]] | str,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        n: int = 1,
    ) -> list[RequestOutput]:
        """One output per prompt in input order; with n > 1, n per prompt: outs[i * n + k] is
        completion k (its `sample`) of prompt i. With a seed, completion 0 uses it and
        completion k a seed derived from (seed, k), as `bulkgen run --n` does for a row's seed
        column, so every completion is reproducible. Calls from several threads run one after
        another (each waits for the one before), each with its own outputs."""
        with self._lock:  # close() takes it too: the engine stays while a call runs
            self._check_open()
            return self._generate(prompts, sampling_params, n)

    def _generate(self, prompts, sampling_params, n: int) -> list[RequestOutput]:
        if n < 1:
            raise ValueError(f"n (completions per prompt) must be >= 1, got {n}")
        if isinstance(prompts, str):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = self.default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(
                f"{len(sampling_params)} SamplingParams given for {len(prompts)} prompts"
            )
        sampling_params = [_sample_params(p, k) for p in sampling_params for k in range(n)]
        vocab = self.engine.model_config.vocab_size
        if too_many := [p.logprobs for p in sampling_params if (p.logprobs or 0) > vocab]:
            raise ValueError(
                f"logprobs {too_many[0]} is more than the model's vocabulary ({vocab})"
            )
        if self.engine.tokenizer is None and any(p.constrained for p in sampling_params):
            self.engine.tokenizer = self.tokenizer  # the grammars' tokenizer: loaded once
        prompt_ids = [self._prompt_ids(i, prompt, vocab) for i, prompt in enumerate(prompts)]
        # Ids of this call's own: a request an earlier call left (it raised) is never taken.
        self._calls += 1
        names = [f"{self._calls}.{j}" for j in range(len(sampling_params))]
        outputs: dict[str, RequestOutput] = {}
        seen: dict[str, list[int]] = {}  # output so far of requests with stop strings
        stops = {names[j]: p.stop for j, p in enumerate(sampling_params) if p.stop}
        try:
            for j, params in enumerate(sampling_params):
                self.engine.add(names[j], prompt_ids[j // n], params)
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    outputs[out.request_id] = out
                if stops and self.tokenizer is not None:
                    self._end_at_stops(stops, seen)
        except BaseException:  # Ctrl-C in a notebook, an error: leave the engine empty
            self._discard(names)
            raise
        ordered = [outputs[name] for name in names]
        for i, out in enumerate(ordered):
            out.sample = i % n
        if self.tokenizer is not None:
            self._decode(ordered, sampling_params)
        return ordered

    def _prompt_ids(self, i: int, prompt, vocab: int) -> list[int]:
        """Prompt i's token ids (text encoded); ValueError for an id the model has not."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids or prompt == "":  # "" is empty even where the tokenizer adds a BOS
            raise ValueError(f"prompt {i} is empty")
        if bad := [t for t in ids if not _is_int(t) or not 0 <= t < vocab]:
            raise ValueError(
                f"prompt {i} holds token id {bad[0]!r}, outside the model's vocabulary ({vocab})"
            )
        return ids

    def _discard(self, names: list[str]) -> None:
        """End a failed call's requests, step until the engine holds none of them, and drop the
        free blocks from the prefix cache (the call may have raised between a block's
        registration and the write of its KV: later calls read it as cached)."""
        for name in names:
            self.engine.abort(name)
        for _ in range(8):  # aborted requests leave at the next step's end
            if not self.engine.has_unfinished():
                break
            self.engine.step()
        self.engine.scheduler.blocks.forget_free()

    def _decode(self, outputs: list[RequestOutput], params: list[SamplingParams]) -> None:
        """Fill each output's text; cut those holding a stop string (text and tokens alike)."""
        stopped = []
        for out, p in zip(outputs, params, strict=True):
            out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            cut = cut_at_stop(out.text, p.stop) if p.stop else None
            if cut is not None:  # the authoritative cut, on the whole text
                out.text, out.finish_reason = cut, "stop"
                stopped.append(out)
        if stopped:

            def decode(ids: list[list[int]]) -> list[str]:
                return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

            ids, texts = [o.token_ids for o in stopped], [o.text for o in stopped]
            for out, count in zip(stopped, kept_token_counts(ids, texts, decode), strict=True):
                keep_first_tokens(out, count)

    def _end_at_stops(self, stops: dict[str, tuple[str, ...]], seen: dict[str, list[int]]) -> None:
        """Abort requests whose new text holds a stop string (the window re-decodes a few
        earlier tokens, so a stop string spanning the last steps is seen too)."""
        for request_id, new in self.engine.take_progress():
            ids = seen.setdefault(request_id, [])
            ids += new
            # Special tokens skipped, as the final cut (_decode) and bulkgen run's watcher do.
            tail = self.tokenizer.decode(
                ids[-(len(new) + _STOP_CONTEXT) :], skip_special_tokens=True
            )
            if cut_at_stop(tail, stops[request_id]) is not None:
                self.engine.abort(request_id)

    def chat(
        self,
        conversations: Sequence[dict] | Sequence[Sequence[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        system: str | None = None,
        n: int = 1,
    ) -> list[RequestOutput]:
        """Generate the assistant's next turn of each conversation ([{role, content}, ...])
        with the model's chat template; `system` adds a system message where none leads."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = []
        for messages in conversations:
            messages = checked_messages(list(messages))  # as bulkgen run: text parts joined
            if system is not None and (not messages or messages[0].get("role") != "system"):
                messages = [{"role": "system", "content": system}, *messages]
            ids = self.tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True
            )
            prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        return self.generate(prompts, sampling_params, n=n)


def _sample_params(params: SamplingParams, k: int) -> SamplingParams:
    """Completion k's parameters: its own seed when seeded (the same for every rerun)."""
    if k == 0 or params.seed is None or params.greedy:
        return params
    return replace(params, seed=sample_seed(params.seed, k))
