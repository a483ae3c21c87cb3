"""What a job is checked and recorded with before any work: its inputs, its model folder and
tokenizer (checked_parts), and the record job.json keeps of it (job_record). A mistake a user can
make here is a UserError, raised before a thread starts or a shard is written."""

from __future__ import annotations

import importlib.metadata
import json
import random
import time
from pathlib import Path

import pyarrow as pa

from bulkgen.errors import UserError
from bulkgen.io.fingerprint import fingerprints
from bulkgen.io.inputs import find_sources
from bulkgen.io.job import Done, JobDir
from bulkgen.io.reader import Reader
from bulkgen.io.schema import parquet_unwritable
from bulkgen.io.tabular import table_schema
from bulkgen.run_config import RunConfig
from bulkgen.structured import check_job_constraint
from bulkgen.text.chat import use_chat_template
from bulkgen.text.prompt_template import PromptTemplate, RenderPrompts
from bulkgen.text.stage import Tokenize


def checked_reader(config: RunConfig) -> Reader:
    """The inputs, checked (files, columns), and the job's structured-output constraint;
    nothing about the model yet."""
    check_job_constraint(config.sampling)
    template = None if config.prompt_template is None else PromptTemplate(config.prompt_template)
    reader = Reader(
        find_sources(config.inputs, exclude=config.out),
        config.prompt_column,
        config.id_column,
        config.keep_columns,
        template_columns=None if template is None else template.variables,
        messages_column=config.messages_column,
        limit=config.limit,
    )
    reader.check()
    if template is not None and reader.has_batch_files():
        raise UserError(
            "--prompt-template with an OpenAI Batch input: its requests carry their own "
            "messages or prompt; leave the template out"
        )
    if config.format == "parquet" and config.keep_columns:
        unwritable = parquet_unwritable(reader.keep_schema())
        if unwritable:
            raise UserError(
                f"--keep-columns: a Parquet shard cannot hold {'; '.join(unwritable)}: keep "
                "it with --format jsonl, or leave it out"
            )
    return reader


def checked_parts(config: RunConfig, reader: Reader | None = None) -> tuple:
    """What a user can get wrong about the inputs and the model, checked before any work: the
    reader, the model folder, its tokenizer and the tokenizer stage."""
    template = None if config.prompt_template is None else PromptTemplate(config.prompt_template)
    reader = reader or checked_reader(config)
    model_dir = model_folder(config.model, weights=config.load_format != "dummy")
    check_fp8(config, model_dir, model_config_of(config, model_dir))
    tokenizer = tokenizer_of(model_dir)
    if config.chat_template_text is not None:
        use_chat_template(tokenizer, config.chat_template_text, config.system)
    vocab = vocab_size(model_dir, tokenizer)
    if (config.sampling.logprobs or 0) > vocab:
        raise UserError(
            f"--logprobs {config.sampling.logprobs} is more than the model's vocabulary "
            f"({vocab} tokens)"
        )
    tokenize = Tokenize(tokenizer, _use_template(config, tokenizer), vocab, system=config.system)
    if template is not None:
        tokenize = RenderPrompts(template, tokenize)
    return reader, model_dir, tokenizer, tokenize


def job_record(config: RunConfig, model_dir: Path, reader: Reader | None = None) -> dict:
    """What job.json records of a job when it starts (reader: its inputs' fingerprints too)."""
    files = {} if reader is None else {"input_files": fingerprints(reader.sources)}
    record = {
        "settings": config.job_settings(),
        "inputs": list(config.inputs),
        **files,
        "batch_invariant": config.batch_invariant,
        "model_path": str(model_dir),
        "bulkgen_version": bulkgen_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if uses_job_seed(config, reader):
        # Seeds sampled rows without --seed: a rerun into this folder samples the same.
        record["job_seed"] = random.getrandbits(62)
    return record


def take_folder(job: JobDir, config: RunConfig, model_dir: Path, reader: Reader) -> Done:
    """Lock the job's folder and prepare it (JobDir.prepare). The inputs are checked again first,
    holding the lock: the check before the model loaded found nothing written, but another run
    into the same folder may have written its first shards since (its inputs then are the job's,
    and a file changed since must be refused, not resumed with another content's rows)."""
    job.lock()
    record = job_record(config, model_dir, reader)
    allowed, overwrite = config.allow_changed_input, config.overwrite
    reader.recorded_first(job.check_inputs(record["input_files"], allowed, overwrite))
    return job.prepare(record, overwrite)


def uses_job_seed(config: RunConfig, reader: Reader | None) -> bool:
    """Whether a row may sample without --seed: the job samples (temperature > 0), or its rows
    may set their own temperature (JSONL and Batch rows may; Parquet, CSV/TSV and saved datasets
    when they have a temperature column). Unknown inputs count as may."""
    if config.sampling.seed is not None:
        return False
    if not config.sampling.greedy or reader is None:
        return True
    for source in reader.sources:
        if source.kind == "jsonl":
            return True
        try:
            names = table_schema(source).names
        except (OSError, ValueError, pa.ArrowException):  # the reader reports it; assume "may"
            return True
        if "temperature" in names:
            return True
    return False


def bulkgen_version() -> str:
    try:
        return importlib.metadata.version("bulkgen")
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0"


def model_folder(name: str, weights: bool = True) -> Path:
    """The local folder of a --model value (folder, alias or Hub id); weights=False accepts a
    folder without weights (for --load-format dummy)."""
    from bulkgen.model.hub import ModelNotFoundError, resolve_model  # the Hub only if needed

    try:
        return resolve_model(name, weights=weights)
    except ModelNotFoundError as e:
        raise UserError(str(e)) from e


def model_config_of(config: RunConfig, model_dir: Path) -> dict | None:
    """The folder's config.json, checked as the engine will read it, before the tokenizer reads
    it (a config.json that is not JSON was blamed on the tokenizer; an unknown architecture came
    after a transformers warning); None where it cannot be read (the engine names why)."""
    from bulkgen.model.config import ModelConfig

    try:
        model_config = json.loads((model_dir / "config.json").read_text())
        ModelConfig.from_dict(model_config)
    except OSError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        what = "is not JSON" if isinstance(e, json.JSONDecodeError) else "cannot be used"
        raise UserError(f"cannot load model {config.model}: its config.json {what}: {e}") from None
    return model_config


def check_fp8(config: RunConfig, model_dir: Path, model_config: dict | None) -> None:
    """FP8 weights (--quantization fp8, or an FP8 checkpoint) need a GPU with FP8 tensor cores,
    and a scheme bulkgen reads: a UserError now rather than after the threads start."""
    if model_config is None:
        return  # the engine names what is wrong with the folder
    if config.quantization is None and "quantization_config" not in model_config:
        return
    from bulkgen.engine.model_files import resolve_device
    from bulkgen.model.fp8 import fp8_unsupported
    from bulkgen.model.fp8_checkpoint import weight_quantization

    dummy = config.load_format == "dummy"
    try:
        if weight_quantization(model_config, config.quantization, dummy) is None:
            return
        device = resolve_device(config.device)
    except (ValueError, RuntimeError) as e:  # a bad scheme, no CUDA, a bad device name
        raise UserError(f"model {config.model}: {e}") from e
    reason = fp8_unsupported(device)
    if reason is not None:
        raise UserError(f"model {config.model}: {reason}")


def tokenizer_of(model_dir: Path):
    """The tokenizer of a model folder; a UserError if it has none that loads."""
    from bulkgen.text.tokenizer import load_tokenizer

    try:
        return load_tokenizer(model_dir)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load the tokenizer of {model_dir}: {e}") from e


def _use_template(config: RunConfig, tokenizer) -> bool:
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if config.chat_template and not has_template:
        raise UserError(
            f"model {config.model} has no chat template; leave out --chat-template to send "
            "prompts as they are"
        )
    use = has_template if config.chat_template is None else config.chat_template
    if config.system is not None and not use:
        raise UserError(
            "--system needs the model's chat template"
            + (", and --no-chat-template turns it off" if has_template else "; this model has none")
        )
    return use


def vocab_size(model_dir: Path, tokenizer) -> int:
    """The model's vocabulary (its embedding's rows, its logits' width; config.json's), else the
    tokenizer's: a prompt's ids and a row's logprobs must stay inside it. It may be larger than
    the tokenizer's (padded) or smaller (a tokenizer with ids the model lacks: the rows whose
    prompts hold them are error records, where the embedding's IndexError ended the job)."""
    try:
        vocab = json.loads((model_dir / "config.json").read_text()).get("vocab_size") or 0
    except (OSError, ValueError):
        vocab = 0
    return int(vocab) or len(tokenizer)
