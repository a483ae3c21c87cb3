"""FakeEngine: a stand-in with the Engine's interface and no model, for tests and bench_io.

It answers each request after a fixed number of steps, with fixed tokens or with tokens derived
from the prompt (its ids reversed), so a test can tell which output belongs to which row. Like the
real engine, it runs at most max_num_seqs requests at once and turns an over-long prompt into an
error output instead of raising.

The pipeline uses it instead of the real engine when BULKGEN_FAKE_ENGINE is set to a JSON object
of its keyword arguments (e.g. '{"steps": 2}'). That switch exists for tests only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.request import RequestOutput

FAKE_ENGINE_ENV = "BULKGEN_FAKE_ENGINE"


@dataclass
class _Pending:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    steps_left: int


class FakeEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        steps: int = 2,
        tokens: list[int] | None = None,
        max_model_len: int = 512,
        eos_token_ids: list[int] | None = None,
        step_delay: float = 0.0,
        fail_after_steps: int | None = None,
        step_per_token: bool = False,
    ) -> None:
        self.config = config or EngineConfig(model="fake")
        self.steps = steps
        self.tokens = tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = list(eos_token_ids or [2])
        self.step_delay = step_delay
        self.fail_after_steps = fail_after_steps  # raise from step(), to test failure handling
        # A request takes one step per token it answers (rows of uneven lengths), not `steps`.
        self.step_per_token = step_per_token
        self._waiting: deque[_Pending] = deque()
        self._running: list[_Pending] = []
        self._errors: list[RequestOutput] = []
        self._aborted: set[str] = set()
        self._num_steps = 0
        self.closed = False

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_ids) >= self.max_model_len:
            message = (
                f"prompt has {len(prompt_ids)} tokens; the model's context is "
                f"{self.max_model_len} tokens"
            )
            self._errors.append(RequestOutput(request_id, prompt_ids, [], "error", message))
            return
        steps = self.steps
        if self.step_per_token:
            steps = max(1, len(self._answer(prompt_ids, params)))
        self._waiting.append(_Pending(request_id, prompt_ids, params, steps))

    def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    def take_progress(self) -> list[tuple[str, list[int]]]:
        """Nothing: an answer appears whole when its request ends (stop strings are then cut
        from the text by the detokenizer, as for a real request that ends before a watcher's
        abort lands)."""
        return []

    @property
    def num_unfinished(self) -> int:
        return len(self._waiting) + len(self._running) + len(self._errors)

    def step(self) -> list[RequestOutput]:
        self._num_steps += 1
        if self.fail_after_steps is not None and self._num_steps > self.fail_after_steps:
            raise RuntimeError("FakeEngine failed on purpose")
        if self.step_delay:
            time.sleep(self.step_delay)
        finished, self._errors = self._errors, []
        while self._waiting and len(self._running) < self.config.seq_rows:
            self._running.append(self._waiting.popleft())
        still = []
        for p in self._running:
            p.steps_left -= 1
            if p.steps_left <= 0 or p.request_id in self._aborted:
                finished.append(self._output(p))
                self._aborted.discard(p.request_id)
            else:
                still.append(p)
        self._running = still
        return finished

    def _answer(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        natural = self.tokens if self.tokens is not None else prompt_ids[::-1]
        return list(natural[: params.max_tokens])

    def _output(self, p: _Pending) -> RequestOutput:
        natural = self.tokens if self.tokens is not None else p.prompt_ids[::-1]
        reason = "length" if len(natural) >= p.params.max_tokens else "stop"
        return RequestOutput(
            p.request_id, p.prompt_ids, self._answer(p.prompt_ids, p.params), reason
        )

    @property
    def stats(self) -> dict:
        return {"engine": "fake", "steps": self._num_steps}

    def close(self) -> None:
        self.closed = True
