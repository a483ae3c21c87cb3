"""GenerationEngine: what the pipeline's engine thread (stages.generate) calls on an engine.

Engine (engine.py) is the real one; FakeEngine (fake.py) stands in for tests and bench_io. Both
have every member, so the pipeline never probes for one.
"""

from __future__ import annotations

from typing import Protocol

from bulkgen.config import SamplingParams
from bulkgen.engine.request import RequestOutput


class GenerationEngine(Protocol):
    @property
    def num_unfinished(self) -> int:
        """Requests added and not yet returned by step()."""
        ...

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None: ...

    def abort(self, request_id: str) -> None:
        """End a request at the next step (its output so far is returned)."""
        ...

    def step(self) -> list[RequestOutput]:
        """One step; the requests it finished."""
        ...

    def take_progress(self) -> list[tuple[str, list[int]]]:
        """New output tokens of unfinished requests with stop strings, since the last call."""
        ...

    @property
    def stats(self) -> dict: ...

    def close(self) -> None: ...
