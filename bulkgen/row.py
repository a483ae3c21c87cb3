"""Row: all the state of one input row on its way from the reader to a shard."""

from __future__ import annotations

from dataclasses import dataclass

from bulkgen.config import SamplingParams
from bulkgen.engine.token_logprobs import TokenLogprobs
from bulkgen.structured import response_format_fields

# Optional input columns that override the job's sampling parameters for their row.
PARAM_COLUMNS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop")
PARAM_COLUMNS += ("repetition_penalty", "presence_penalty", "frequency_penalty")
PARAM_COLUMNS += ("response_format",)  # structured output, OpenAI's shape (structured.py)
# Most samples one row may ask for (an OpenAI batch row's n): each is a copy of the row in memory.
MAX_N = 4096


def param_overrides(values: dict) -> dict | None:
    """The parameter columns a row gives (null means not given), or None."""
    given = {k: v for k, v in values.items() if v is not None}
    return given or None


_INT_PARAMS = ("max_tokens", "top_k", "seed", "logprobs")
_FLOAT_PARAMS = ("temperature", "top_p", "min_p")
_FLOAT_PARAMS += ("repetition_penalty", "presence_penalty", "frequency_penalty")


def checked_overrides(overrides: dict) -> dict:
    """Per-row parameter values with their types checked; ValueError names the bad column."""
    out = {}
    for name, value in overrides.items():
        if name == "n":  # the number of samples: see samples.py
            continue
        if name in _INT_PARAMS:
            ok = isinstance(value, int) and not isinstance(value, bool)
            if isinstance(value, float) and value.is_integer():
                ok, value = True, int(value)
            if not ok:
                raise ValueError(f"column {name!r} must be an integer, got {value!r}")
        elif name in _FLOAT_PARAMS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"column {name!r} must be a number, got {value!r}")
            value = float(value)
        elif name == "stop":
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError("column 'stop' must be a string or a list of strings")
            value = tuple(value)
        elif name == "response_format":
            out.update(_response_format(value))
            continue
        out[name] = value
    return out


def _response_format(value: object) -> dict:
    """The constraint fields of a response_format value (its grammar is checked by the reader:
    io/validate.py)."""
    try:
        fields = response_format_fields(value)
    except ValueError as e:
        raise ValueError(f"column 'response_format': {e}") from None
    return fields


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
    index: int = -1  # its row number in its input file (0-based, as in default ids)
    line: int = 0  # its line number in a JSONL file (1-based), else 0
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
    # As the engine gives them, flat (no Python object per token: see engine/token_logprobs.py).
    token_logprobs: TokenLogprobs | None = None
    # Set together by the detokenizer (naming): each generated token as text, and the text of
    # each top entry (flat like token_logprobs.top_ids: position p's are [p*k, (p+1)*k)).
    token_texts: list[str] | None = None
    top_texts: list[str] | None = None

    def fail(self, message: str) -> None:
        self.error = message
        self.finish_reason = "error"

    def top_dicts(self) -> list[list[dict]]:
        """Per generated position, a {token_id, token, logprob} dict per top entry (a named
        row's JSON form)."""
        lp, texts = self.token_logprobs, self.top_texts
        k, ids, values = lp.k, lp.top_ids.tolist(), lp.top_logprobs.tolist()
        return [
            [
                {"token_id": ids[j], "token": texts[j], "logprob": values[j]}
                for j in range(p * k, p * k + k)
            ]
            for p in range(len(lp))
        ]

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids) if self.prompt_ids is not None else 0

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else 0
