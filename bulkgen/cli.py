"""The bulkgen command: `bulkgen run` and `bulkgen models`.

A mistake a user can fix ends in one line on stderr and exit status 1; bad flag values in a usage
message and status 2; Ctrl-C in status 130 and SIGTERM in 143, with the finished shards kept for a
rerun (exits.py says how the process ends without a C++ abort).
"""

from __future__ import annotations

import sys

import click

from bulkgen.run_options import run_options


def _version() -> str:
    from bulkgen.preflight import bulkgen_version

    return bulkgen_version()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bulkgen", message="bulkgen %(version)s")
def main() -> None:
    """bulkgen: offline bulk generation for LLMs."""


@main.command(no_args_is_help=True)
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@run_options
def run(**options) -> None:
    """Generate a completion for every row of INPUT... and write sharded results to --out.

    INPUT is a .jsonl(.gz), .parquet, .csv(.gz) or .tsv(.gz) file (or an OpenAI Batch .jsonl),
    a folder or quoted glob of them, or a folder
    written by the datasets library's save_to_disk. Rows that cannot be used (bad JSON, a null,
    empty or non-string prompt, a prompt longer than the model's context) are written as error
    records and the run goes on.
    """
    from bulkgen import cpu, exits

    cpu.before_torch()
    try:
        with exits.sigterm_interrupts():
            _run(**options)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (exits.Terminated)
        click.echo(f"interrupted: rerun the same command to resume into {options['out']}",
                   err=True)  # fmt: skip
        exits.exit_process(exits.interrupt_status(e))
    except SystemExit as e:
        exits.exit_process(e.code if isinstance(e.code, int) else 1)
    exits.exit_process(0)


# The structured-output flags, in flag_fields' order.
_CONSTRAINT_FLAGS = ("json_schema", "json_object", "regex", "choice")
_UNSET = {"json_schema": None, "json_object": False, "regex": None, "choice": ()}


def _constraint_values(generation: dict) -> list:
    """The four constraint flags' values (popped from generation). A recipe's constraint gives
    way to one given on the command line, of whatever kind: flags override a recipe's fields."""
    ctx = click.get_current_context()
    values = {k: generation.pop(k) for k in _CONSTRAINT_FLAGS}
    sources = {k: ctx.get_parameter_source(k) for k in _CONSTRAINT_FLAGS}
    if any(s is click.core.ParameterSource.COMMANDLINE for s in sources.values()):
        for k, source in sources.items():
            if source is click.core.ParameterSource.DEFAULT_MAP:
                values[k] = _UNSET[k]
    return [values[k] for k in _CONSTRAINT_FLAGS]


def _run(inputs, model, out, prompt_column, prompt_template, id_column, keep_columns, fmt,
         shard_size, max_tokens, temperature, top_p, top_k, min_p, seed, chat_template,
         dtype, device, max_num_seqs, max_batch_tokens, kv_memory, sync, quiet,
         overwrite, **generation) -> None:  # fmt: skip
    if not quiet:
        _show_progress_messages()
    from bulkgen.config import SamplingParams
    from bulkgen.errors import UserError
    from bulkgen.pipeline import run as run_pipeline
    from bulkgen.run_config import RunConfig
    from bulkgen.structured import flag_fields
    from bulkgen.text.prompt_template import chat_template_text, template_source

    ray_address = generation.pop("ray_address")  # scaling out (issue 6)
    try:
        from bulkgen.parallel import parse_workers

        workers = parse_workers(generation.pop("data_parallel"))
        config = RunConfig(
            inputs=inputs,
            out=out,
            model=model,
            prompt_column=prompt_column,
            prompt_template=None if prompt_template is None else template_source(prompt_template),
            chat_template_text=chat_template_text(generation.pop("chat_template_file")),
            id_column=id_column,
            keep_columns=tuple(c.strip() for c in keep_columns.split(",") if c.strip()),
            format=fmt,
            shard_size=shard_size,
            sampling=SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                min_p=min_p,
                seed=seed,
                stop=generation.pop("stop"),
                stop_token_ids=generation.pop("stop_token_id"),
                logprobs=generation.pop("logprobs"),
                repetition_penalty=generation.pop("repetition_penalty"),
                presence_penalty=generation.pop("presence_penalty"),
                frequency_penalty=generation.pop("frequency_penalty"),
                **flag_fields(*_constraint_values(generation)),
            ),
            chat_template=chat_template,
            dtype=dtype,
            device=device,
            max_num_seqs=max_num_seqs,
            max_batch_tokens=max_batch_tokens,
            kv_memory=kv_memory,
            sync=sync,
            quiet=quiet,
            overwrite=overwrite,
            **generation,  # messages_column, system, n, prefix_cache, max_model_len, load_format
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    except UserError as e:  # an unreadable --prompt-template or --json-schema file
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    from bulkgen.recipes import after_run, check_score

    try:
        check_score(click.get_current_context(), config.keep_columns, config.format)
        if workers is None and ray_address is None:
            stats = run_pipeline(config)
        else:
            from bulkgen.parallel import run_parallel

            stats = run_parallel(config, workers, ray_address)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if "nothing_left" in stats:  # the model was not loaded
        click.echo(f"nothing to generate: {stats['nothing_left']} ({out})", err=True)
    elif not quiet:
        click.echo(summary(stats, out, config.n), err=True)
    try:
        after_run(click.get_current_context(), out, quiet)  # a recipe's score, if it has one
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


def _show_progress_messages() -> None:
    """The model hub's INFO lines (fetching and converting the demo model: the first run's
    wait) on stderr, as `bulkgen: ...`."""
    import logging

    class Stderr(logging.Handler):  # the stderr of now, not of when it was added
        def emit(self, record: logging.LogRecord) -> None:
            click.echo(f"bulkgen: {record.getMessage()}", err=True)

    log = logging.getLogger("bulkgen.model.hub")
    if not any(type(h).__name__ == "Stderr" for h in log.handlers):
        log.addHandler(Stderr())
        log.setLevel(logging.INFO)


def summary(stats: dict, out: str, n: int = 1) -> str:
    """The line a finished run prints: with --n, input rows and samples counted apart."""
    from bulkgen.progress import format_rate

    this = stats["this_run"]
    if n > 1 and "input_rows" in this:  # a resumed row may run only its missing samples
        what = f"{this['rows']} results ({n} samples a row) of {this['input_rows']} input rows"
        total = f"{stats['rows']} results in all"
    else:
        what, total = f"{this['rows']} rows", f"{stats['rows']} rows in all"
    return (
        f"{what} ({this['errors']} errors) written to {out} in {stats['wall_time_s']:.1f} s, "
        f"{format_rate(stats['generated_tokens_per_s'])} generated tokens/s; {total}"
    )


@main.command()
def models() -> None:
    """List the model aliases that --model accepts."""
    from bulkgen.model.hub import DEFAULT_MODEL as default
    from bulkgen.model.hub import list_aliases

    aliases = list_aliases()
    width = max(len(alias) for alias, _ in aliases)
    for alias, hub_id in aliases:
        mark = "  (default)" if alias == default else ""
        click.echo(f"{alias:<{width}}  {hub_id}{mark}")


@main.command(no_args_is_help=True)
@click.argument("results", type=click.Path(file_okay=False))
@click.option(
    "--reference-column",
    default="answer",
    show_default=True,
    help="Column of RESULTS holding the reference answer (keep it with --keep-columns when "
    "generating). Alternatives may be separated by '|'.",
)
@click.option(
    "--baseline",
    type=click.Path(file_okay=False),
    default=None,
    help="A previous run's results folder: list the ids whose correctness changed since.",
)
@click.option(
    "--references",
    type=click.Path(dir_okay=False),
    default=None,
    help="A .jsonl or .parquet file with the reference column keyed by id (or custom_id): the "
    "eval set, for results that do not keep its answers (--format openai never does).",
)
def score(results, reference_column, baseline, references) -> None:
    """Score the answers in RESULTS by exact match against a reference column.

    The answer is extracted from each row's text (the number after "answer is", else the last
    number, for a numeric reference; the first clause, normalised, for any other) and the
    accuracy merged into RESULTS/stats.json under "score".
    """
    from bulkgen.errors import UserError
    from bulkgen.score import score_folder, summary

    try:
        section = score_folder(results, reference_column, baseline, references)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    for line in summary(section):
        click.echo(line)


if __name__ == "__main__":
    main()
