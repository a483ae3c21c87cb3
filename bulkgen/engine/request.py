"""Request: all the state of one generation request, and the record it leaves when it ends."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from bulkgen.config import SamplingParams
from bulkgen.engine.blocks import ChainKey
from bulkgen.engine.grammar import Matcher
from bulkgen.engine.token_logprobs import LogprobRecorder, TokenLogprobs


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    """What the engine hands back for a finished request (token ids only; text comes later)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "error"
    error: str | None = None
    num_cached_tokens: int = 0
    # With SamplingParams.logprobs: the sampled token's logprob and the top alternatives of each
    # generated position, flat (the pipeline reads these; see logprobs and top_logprobs).
    token_logprobs: TokenLogprobs | None = None
    text: str | None = None
    sample: int = 0  # which of LLM.generate's n completions of its prompt this is

    @property
    def logprobs(self) -> list[float] | None:
        """Per generated position, the sampled token's logprob (a new list at each access)."""
        return None if self.token_logprobs is None else self.token_logprobs.chosen.tolist()

    @property
    def top_logprobs(self) -> list[list[tuple[int, float]]] | None:
        """Per generated position, the top alternatives as (token_id, logprob) pairs, best
        first (a new list at each access)."""
        return None if self.token_logprobs is None else self.token_logprobs.pairs()


@dataclass(eq=False)
class Request:
    request_id: str
    # A tuple (Engine.add makes one): once a young collection has seen that it holds only ints,
    # the collector stops tracking it, and no full collection walks a queued prompt again.
    prompt_ids: Sequence[int]
    params: SamplingParams
    seed: int  # params.seed, or one drawn by the engine when the request was added
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    block_ids: list[int] = field(default_factory=list)
    # Tokens whose KV is computed (or being computed by a launched step). Advanced at plan time.
    num_computed: int = 0
    # Tokens sampled by launched steps whose ids have not reached the host yet (0 or 1 with the
    # one-step lag). A request with a pending token cannot be preempted back to a prefill plan,
    # because the plan would need that token on the host.
    num_pending: int = 0
    # The most tokens ever computed: tokens scheduled again below it are recomputed work
    # (after a preemption dropped the cache and the prefix cache did not keep them).
    max_computed: int = 0
    # Blocks of the KV length admission promised the request while it runs (engine/admission.py).
    horizon_blocks: int = 0
    admitted: bool = False  # has run at least once (a preempted request is re-admitted)
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache at admission
    # Row of the runner's device-resident tables (block table, last sampled token) while the
    # request is running; its first num_synced_blocks block ids are already in the device table.
    table_row: int | None = None
    num_synced_blocks: int = 0
    num_hashed_blocks: int = 0  # leading blocks registered in the prefix cache
    last_key: ChainKey | None = None  # the prefix-cache chain key of the last of them
    finish_reason: str | None = None
    error: str | None = None
    num_streamed: int = 0  # output tokens already handed out by Engine.take_progress()
    logprobs: LogprobRecorder | None = None  # with SamplingParams.logprobs, once it has a token
    # With a constrained SamplingParams: the grammar state, advanced on every output token.
    matcher: Matcher | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens known on the host plus those in flight."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]

    def token_at(self, i: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    def token_slice(self, start: int, end: int) -> Sequence[int]:
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        return [*self.prompt_ids[start:], *self.output_ids[max(start - n, 0) : end - n]]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_ids),
            token_ids=self.output_ids,
            finish_reason=self.finish_reason or "error",
            error=self.error,
            num_cached_tokens=self.num_cached_tokens,
            token_logprobs=None if self.logprobs is None else self.logprobs.freeze(),
        )
