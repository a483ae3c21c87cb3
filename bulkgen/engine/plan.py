"""Plan: what one engine step computes, the typed value between Scheduler.schedule() and
ModelRunner.launch(). Each ScheduledSeq is one request's query tokens in the step."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from bulkgen.engine.request import Request


@dataclass(slots=True)
class ScheduledSeq:
    request: Request
    start: int  # position of the first query token (tokens before it are in the cache)
    num_tokens: int  # query tokens this step
    sample: bool  # the chunk reaches the last known token: sample the next one
    from_prev: bool  # the input token is the previous step's pending sample (on the device)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass
class Plan:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    # First-block partners changed since the last plan that ran ({block: partner or -1};
    # BlockManager.take_partner_changes), written to the device table with the step's inputs.
    partners: dict[int, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)

    @property
    def decode_only(self) -> bool:
        return all(s.num_tokens == 1 for s in self.seqs)

    @functools.cached_property
    def sampled(self) -> list[ScheduledSeq]:
        """The rows that sample, in order; computed once (read by the packer, runner, engine and
        update on every step), so only after the plan is complete."""
        return [s for s in self.seqs if s.sample]

    def __bool__(self) -> bool:
        return bool(self.seqs)
