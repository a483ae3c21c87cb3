"""RunConfig: everything `bulkgen run` was asked to do, checked once, frozen."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bulkgen.config import EngineConfig, SamplingParams

# Columns every output shard has, in this order; --keep-columns come after them.
OUTPUT_COLUMNS = (
    "id",
    "prompt",
    "text",
    "finish_reason",
    "error",
    "prompt_tokens",
    "completion_tokens",
)
FORMATS = ("parquet", "jsonl", "openai")
# Output columns that only some jobs have: with --n > 1, with --logprobs, --output-token-ids.
OPTIONAL_COLUMNS = ("sample", "logprobs", "top_logprobs", "token_ids")


@dataclass(frozen=True)
class RunConfig:
    """A bulk-generation job. Engine knobs left as None take EngineConfig's defaults."""

    inputs: tuple[str, ...]
    out: str
    model: str
    prompt_column: str = "prompt"
    id_column: str = "id"
    keep_columns: tuple[str, ...] = ()
    format: str = "parquet"
    shard_size: int = 1000
    # bulkgen run is greedy unless told otherwise: reproducible outputs are the safe default.
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    chat_template: bool | None = None  # None: use the tokenizer's template when it has one
    chat_template_text: str | None = None  # --chat-template-file's Jinja, instead of the model's
    prompt_template: str | None = None  # Jinja text rendering each row's prompt from its columns
    dtype: str = "auto"
    device: str = "auto"
    max_num_seqs: int | str | None = None  # a number or "auto"
    max_batch_tokens: int | None = None
    kv_memory: float | None = None
    max_model_len: int | None = None  # None: the model's own context length
    load_format: str = "auto"  # dummy: random weights of the model's shape (benchmarks)
    quantization: str | None = None  # fp8: quantize the weights at load
    kv_cache_dtype: str = "auto"  # fp8 (e4m3, Ada/Hopper GPUs) or int8: about twice the tokens
    fp8_fast_accum: bool | None = None  # None: FP8 GEMMs sum in the tensor cores' accumulator
    fp8_kv_pair_first_block: bool | None = None  # None: on with an fp8 cache (kv_pairs.py)
    mixed_graphs: bool | None = None  # None: prefill steps replay pieces on one CUDA device
    sync: bool = False
    quiet: bool = False
    overwrite: bool = False
    # Chat, samples and the prefix cache (stop strings and logprobs are in sampling).
    messages_column: str = "messages"
    system: str | None = None  # a system message before each conversation or prompt
    n: int = 1  # samples per row
    prefix_cache: bool = True
    output_token_ids: bool = False  # a token_ids column: each completion's generated ids
    limit: int | None = None  # --limit: only the first rows of the inputs
    allow_changed_input: bool = False  # resume although an input file changed
    tensor_parallel: int = 1  # ranks the model is split over (processes, one GPU each)
    batch_invariant: bool = False  # a row's output does not depend on its batch mates

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
        if not self.inputs:
            raise ValueError("no input given: pass one or more .jsonl/.parquet files or folders")
        if not str(self.out).strip():  # an unset shell variable: never the current folder
            raise ValueError("--out is empty: name the output folder (-o . for this one)")
        if self.format not in FORMATS:
            raise ValueError(f"format must be parquet, jsonl or openai, got {self.format!r}")
        if self.n < 1:
            raise ValueError(f"n (samples per row) must be >= 1, got {self.n}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1 row, got {self.limit}")
        # Text options from a shell whose bytes are not UTF-8 arrive as lone surrogates, which
        # the tokenizer and the writers refuse far from here.
        texts = [("--system", self.system), ("--prompt-template", self.prompt_template)]
        texts += [("--chat-template-file", self.chat_template_text)]
        if self.chat_template is False and self.chat_template_text is not None:
            raise ValueError("--chat-template-file with --no-chat-template: leave one out")
        texts += [("--stop", s) for s in self.sampling.stop]
        for name, text in texts:
            try:
                (text or "").encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(
                    f"{name} holds {text[e.start]!r} at character {e.start}, which is not valid "
                    "UTF-8 (is the shell's locale UTF-8?)"
                ) from None
        if self.shard_size < 1:
            raise ValueError(f"shard size must be >= 1 row, got {self.shard_size}")
        if not self.prompt_column:
            raise ValueError("the prompt column name is empty")
        if self.keep_columns and self.format == "openai":
            raise ValueError(
                "--keep-columns with --format openai: Batch API output lines hold no input "
                "columns; use --format parquet or jsonl to keep them"
            )
        for i, name in enumerate(self.keep_columns):
            if name in self.keep_columns[:i]:
                raise ValueError(f"--keep-columns names {name!r} twice")
            if name in OUTPUT_COLUMNS + OPTIONAL_COLUMNS:
                raise ValueError(
                    f"--keep-columns {name!r} clashes with the output column of that name; "
                    "rename it in the input"
                )
        self.engine_config("")  # so that bad engine knobs fail here, before any work

    def engine_config(self, model_dir: str) -> EngineConfig:
        knobs = {
            "max_num_seqs": self.max_num_seqs,
            "max_batch_tokens": self.max_batch_tokens,
            "kv_memory": self.kv_memory,
            "max_model_len": self.max_model_len,
        }
        given = {k: v for k, v in knobs.items() if v is not None}
        seed = {} if self.sampling.seed is None else {"seed": self.sampling.seed}
        return EngineConfig(
            model=model_dir,
            dtype=self.dtype,
            device=self.device,
            load_format=self.load_format,
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
            fp8_fast_accum=self.fp8_fast_accum,
            fp8_kv_pair_first_block=self.fp8_kv_pair_first_block,
            mixed_graphs=self.mixed_graphs,
            async_loop=not self.sync,
            prefix_cache=self.prefix_cache,
            tensor_parallel=self.tensor_parallel,
            batch_invariant=self.batch_invariant,
            **given,
            **seed,
        )

    def job_settings(self) -> dict:
        """What a rerun must match to resume this job in the same output folder."""
        sampling = dataclasses.asdict(self.sampling)
        return {
            "model": self.model,
            "sampling": {k: list(v) if isinstance(v, tuple) else v for k, v in sampling.items()},
            "prompt_column": self.prompt_column,
            "id_column": self.id_column,
            "keep_columns": list(self.keep_columns),
            "format": self.format,
            "chat_template": "auto" if self.chat_template is None else self.chat_template,
            "prompt_template": self.prompt_template,
            "system": self.system,
            # Left out at their defaults, so that job folders of older versions still resume.
            # The weights, dtypes and context length change every output: a dummy-weights
            # trial or a bf16 run must not be resumed as the real or float32 job.
            **self._non_default(
                "n",
                "chat_template_text",
                "messages_column",
                "output_token_ids",
                "limit",
                "batch_invariant",
                "load_format",
                "dtype",
                "quantization",
                "kv_cache_dtype",
                "max_model_len",
                "fp8_fast_accum",
                "fp8_kv_pair_first_block",
            ),
        }

    def _non_default(self, *names: str) -> dict:
        fields = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: getattr(self, k) for k in names if getattr(self, k) != fields[k]}


def settings_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """What differs between a recorded job_settings() and a rerun's, one phrase each."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += settings_differences(a, b, prefix=f"{key}.")
        elif key not in old or key not in new:  # job_settings leaves some out at their default
            was = "the default" if key not in old else repr(a)
            now = "the default" if key not in new else repr(b)
            diffs.append(f"{prefix}{key} was {was}, now {now}")
        elif a != b:
            diffs.append(f"{prefix}{key} was {a!r}, now {b!r}")
    return diffs
