"""Row: all the state of one input row on its way from the reader to a shard."""

from __future__ import annotations

from dataclasses import dataclass

from bulkgen.config import SamplingParams

# Optional input columns that override the job's sampling parameters for their row.
PARAM_COLUMNS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop")
PARAM_COLUMNS += ("repetition_penalty", "presence_penalty", "frequency_penalty")


def param_overrides(values: dict) -> dict | None:
    """The parameter columns a row gives (null means not given), or None."""
    given = {k: v for k, v in values.items() if v is not None}
    return given or None


@dataclass(slots=True, eq=False)
class Row:
    """One input row. Each stage fills in its part; nothing else keeps per-row state.

    A row with an error set skips the engine and is written as an error record.
    """

    id: str
    prompt: object  # as read: a string, a list of token ids, or anything bad
    extra: dict | None = None  # --keep-columns values
    overrides: dict | None = None  # per-row sampling parameters (PARAM_COLUMNS present)
    columns: dict | None = None  # the --prompt-template variables the row has
    error: str | None = None
    prompt_text: str | None = None  # the prompt column of the output
    prompt_ids: list[int] | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    text: str | None = None
    # Chat, samples, logprobs, OpenAI batch rows.
    messages: object = None  # the messages column as read: a list of {role, content}, or bad
    api: str | None = None  # "chat" or "text": the OpenAI endpoint the row answers
    sample: int = 0  # which of the row's n samples this is
    samples_done: int = 0  # bit k set: sample k is in a complete shard already (resume)
    group: int = 0  # the input row's number in this run: the samples of a row share it
    group_size: int = 1  # how many samples of the row this run generates
    params: SamplingParams | None = None  # set before the engine (samples.py)
    logprobs: list[float] | None = None
    top_logprobs: list | None = None  # per position: (token_id, logprob) pairs, then dicts
    token_texts: list[str] | None = None  # each generated token as text, with logprobs

    def fail(self, message: str) -> None:
        self.error = message
        self.finish_reason = "error"

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids) if self.prompt_ids is not None else 0

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else 0
