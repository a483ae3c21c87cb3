"""Frozen configuration objects. Bad values raise ValueError with a message a user can act on."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from bulkgen.constraint_check import check_constraint

# Bounds of integer parameters: they travel to the device as int32/int64 tensors.
_INT32 = 2**31
# The most requests `max_num_seqs="auto"` ever runs at once: decode on an H200 is compute-bound
# well before it (the 8B's GEMMs at 256 rows already are), so more rows only add KV reads.
AUTO_MAX_NUM_SEQS = 1024


MIN_TEMPERATURE = 1e-5  # below it a request is greedy (SamplingParams.greedy), as in vLLM
# Outside it, positive logits divided by the penalty (negative ones times it) overflow float32.
REPETITION_PENALTY_RANGE = (1e-4, 1e4)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops.

    temperature 0, or below MIN_TEMPERATURE (where logits / T overflow float32), is greedy.
    top_k 0 (or -1), top_p 1.0 and min_p 0.0 disable those filters. A request with a seed
    samples the same tokens whatever its batch mates are.
    Penalties (engine/penalties.py): repetition_penalty as Hugging Face's (over prompt and output
    tokens; 1.0 is off), presence_penalty and frequency_penalty as OpenAI's (over output tokens;
    0.0 is off).
    Structured output (engine/grammar.py): at most one of json_schema (a JSON Schema as JSON
    text; a dict is accepted and stored as compact text, keys in their order, so equal schemas
    compare and hash equal), regex (the whole output must match it) and choice (the output is
    exactly one of these strings). The row stops with finish_reason "stop" once its grammar is
    complete.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    json_schema: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self._check_penalties()
        check_constraint(self)
        for name in ("max_tokens", "top_k", "seed", "logprobs"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral)
            ):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not 1 <= self.max_tokens < _INT32:
            raise ValueError(f"max_tokens must be in [1, 2**31), got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not -1 <= self.top_k < _INT32:
            raise ValueError(
                f"top_k must be -1, 0 (off) or a positive count below 2**31, got {self.top_k}"
            )
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs < _INT32:
            raise ValueError(f"logprobs must be in [0, 2**31), got {self.logprobs}")
        # Lists are accepted for convenience and stored as tuples so params stay hashable.
        ids, stop = self.stop_token_ids or (), self.stop or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        if (
            isinstance(ids, str)
            or not all(map(_is_int, ids))
            or not all(isinstance(t, str) for t in stop)
        ):
            raise ValueError(
                f"stop_token_ids must be integers and stop strings, got {ids!r}, {stop!r}"
            )
        if any(not 0 <= t < _INT32 for t in ids):
            raise ValueError(f"stop token ids must be in [0, 2**31), got {ids}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))
        object.__setattr__(self, "stop", stop)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        temperature = 0.0 if self.greedy else self.temperature  # top_k=1 is greedy too
        penalties = (self.repetition_penalty, self.presence_penalty, self.frequency_penalty)
        floats = (temperature, self.top_p, self.min_p, *penalties)
        object.__setattr__(self, "_sampling_floats", floats)

    def _check_penalties(self) -> None:
        r = self.repetition_penalty
        low, high = REPETITION_PENALTY_RANGE
        if not (isinstance(r, int | float) and not isinstance(r, bool) and low <= r <= high):
            raise ValueError(
                f"repetition_penalty must be a number in [{low:g}, {high:g}] (1.0 is off, above 1 "
                f"discourages repeats), got {r!r}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (
                isinstance(v, int | float) and math.isfinite(v) and -2.0 <= v <= 2.0
            ):
                raise ValueError(
                    f"{name} must be a number in [-2, 2] as in OpenAI's API (0.0 is off), got {v!r}"
                )

    @property
    def constrained(self) -> bool:
        """Output restricted by a grammar (JSON schema, regex or choice)."""
        return self.json_schema is not None or self.regex is not None or self.choice is not None

    @property
    def penalized(self) -> bool:
        """Any penalty on: the engine must keep the request's token counts."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def sampling_floats(self) -> tuple[float, ...]:
        """The float parameters the device sampler reads per row, in inputs.FLOAT_FIELDS order:
        temperature (0 when greedy), top_p, min_p, and the repetition, presence and frequency
        penalties (1, 0, 0 = off). Computed once: the step packer reads it for every row."""
        return self.__dict__["_sampling_floats"]

    @property
    def filtered(self) -> bool:
        """Sampling restricted by top-k, top-p or min-p (moot when greedy)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1


@dataclass(frozen=True)
class EngineConfig:
    """Sizes and switches of the engine. num_blocks None sizes the KV cache from free memory.

    max_num_seqs: the most requests running at once, or "auto": the engine picks it from the KV
    cache's size and the lengths of the requests as they arrive, up to auto_max_num_seqs (and
    max_batch_tokens). auto_max_num_seqs: auto's ceiling (None: AUTO_MAX_NUM_SEQS).
    output_reserve: the share of each request's remaining output that admission keeps cache room
    for (engine/admission.py); None learns it from finished requests
    (1 for requests whose length is known); 0 promises nothing: a request is admitted when its
    first chunk fits and preemption makes room, as engines without a horizon (vLLM) do.
    """

    model: str
    dtype: str = "auto"
    device: str = "auto"
    load_format: str = "auto"  # auto | safetensors | dummy
    quantization: str | None = None  # fp8: FP8 weights, quantized at load (model/fp8.py)
    # FP8 GEMMs sum K in the tensor cores' own accumulator (cuBLASLt's use_fast_accum), as vLLM's
    # and TensorRT-LLM's do: faster where the GEMMs are compute-bound, no less accurate on the demo
    # model (README, FP8). None: on with FP8 weights (resolve_fast_accum); False: exact sums.
    fp8_fast_accum: bool | None = None
    # Tokens per KV block; None: 16, or SLOTS_INNER_BLOCK_SIZE for an fp8 cache whose values the
    # engine stores slots inner (model/attention/kv_layout.py).
    block_size: int | None = None
    num_blocks: int | None = None
    kv_memory: float = 0.9  # fraction of free device memory for the KV cache
    # Tokens a step, prefill chunks included (2048 before a52960b; on the H200 8192 ran bulk and
    # trt FP8-KV 1.5-2.1% faster, 4096 and 16384 less: README, Step size).
    max_batch_tokens: int = 8192
    max_num_seqs: int | str = "auto"
    auto_max_num_seqs: int | None = None
    output_reserve: float | None = None
    max_model_len: int | None = None
    attention: str = "auto"  # auto | torch | triton
    # auto (the model's dtype) | fp8 (e4m3: twice the tokens) | int8 (a scale per token and head)
    kv_cache_dtype: str = "auto"
    # An fp8 cache's first block at about 16-bit precision in a partner block (kv_pairs.py;
    # None: off, it buys little on long texts, README); True with another cache: an error.
    fp8_kv_pair_first_block: bool | None = None
    async_loop: bool = True
    cuda_graphs: bool = True
    # Steps with prefill replay CUDA graphs of everything but attention (engine/mixed_graphs.py),
    # per multiple of mixed_graph_tokens tokens. None: on for one CUDA device with cuda_graphs
    # (a mixed step's launch 32 -> 10 ms bf16 on the H200), off on the CPU and under TP.
    mixed_graphs: bool | None = None
    mixed_graph_tokens: int = 128
    prefix_cache: bool = True
    seed: int = 0
    tensor_parallel: int = 1  # ranks (processes, one GPU each) the model is split over
    # Kernels whose arithmetic for a row does not depend on its batch (model/invariant.py).
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.tensor_parallel, bool) or not isinstance(self.tensor_parallel, int):
            raise ValueError(f"tensor_parallel must be an integer, got {self.tensor_parallel!r}")
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.block_size is not None and (
            not _is_int(self.block_size)
            or self.block_size < 1
            or self.block_size & (self.block_size - 1)
        ):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        for name in ("num_blocks", "max_batch_tokens", "max_model_len"):  # before the < below
            if (value := getattr(self, name)) is not None and not _is_int(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 or None, got {self.num_blocks}")
        if isinstance(self.kv_memory, bool) or not isinstance(self.kv_memory, int | float):
            raise ValueError(f"kv_memory must be a number, got {self.kv_memory!r}")
        if not 0.0 < self.kv_memory <= 1.0:
            raise ValueError(f"kv_memory must be a fraction in (0, 1], got {self.kv_memory}")
        for name in ("fp8_fast_accum", "fp8_kv_pair_first_block", "mixed_graphs"):
            if (value := getattr(self, name)) not in (None, True, False):
                raise ValueError(f"{name} must be true, false or unset, got {value!r}")
        if not _is_int(self.mixed_graph_tokens) or self.mixed_graph_tokens < 1:
            raise ValueError(
                f"mixed_graph_tokens must be a positive integer, got {self.mixed_graph_tokens!r}"
            )
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        auto = self.max_num_seqs == "auto"
        if not auto and (not _is_int(self.max_num_seqs) or self.max_num_seqs < 1):
            raise ValueError(f"max_num_seqs must be >= 1 or 'auto', got {self.max_num_seqs!r}")
        ceiling = self.auto_max_num_seqs
        if ceiling is not None and (not _is_int(ceiling) or ceiling < 1):
            raise ValueError(f"auto_max_num_seqs must be >= 1 or None, got {ceiling!r}")
        if self.output_reserve is not None and not 0.0 <= self.output_reserve <= 1.0:
            raise ValueError(
                f"output_reserve must be a share in [0, 1] or None, got {self.output_reserve}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 tokens, got {self.max_model_len}")
        for name, choices in _CHOICES.items():
            if (value := getattr(self, name)) not in choices:
                named = f"{', '.join(choices[:-1])} or {choices[-1]}"
                raise ValueError(f"{name} must be {named}, got {value!r}")
        if self.quantization not in (None, "fp8"):
            raise ValueError(f"quantization must be fp8 or None, got {self.quantization!r}")
        if self.batch_invariant and self.tensor_parallel > 1:
            raise ValueError(
                "batch_invariant does not combine with tensor_parallel > 1: the all-reduce's "
                "order of summation follows the message size; run the model on one GPU"
            )
        if self.batch_invariant and self.quantization is not None:
            raise ValueError(
                "batch_invariant does not combine with FP8 weights (--quantization fp8): their "
                "GEMMs are cuBLAS's, whose kernel choice follows the batch size"
            )

    @property
    def auto_num_seqs(self) -> bool:
        return self.max_num_seqs == "auto"

    @property
    def seq_rows(self) -> int:
        """The most requests that can ever run at once: the rows of the per-request device
        tables and buffers (auto: its ceiling; a decode step never has more rows than tokens)."""
        if self.auto_num_seqs:
            return min(self.auto_max_num_seqs or AUTO_MAX_NUM_SEQS, self.max_batch_tokens)
        return self.max_num_seqs

    @property
    def graph_rows(self) -> int:
        """The widest decode step: decode graphs are captured up to it."""
        return min(self.seq_rows, self.max_batch_tokens)


_CHOICES = {"attention": ("auto", "torch", "triton"), "kv_cache_dtype": ("auto", "fp8", "int8"),
            "load_format": ("auto", "safetensors", "dummy")}  # fmt: skip


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
