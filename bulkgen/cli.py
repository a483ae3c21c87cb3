"""The bulkgen command: `bulkgen run` and `bulkgen models`.

A mistake a user can fix ends in one line on stderr and exit status 1; bad flag values in a usage
message and status 2; Ctrl-C in status 130, with the finished shards kept for a rerun.
"""

from __future__ import annotations

import sys

import click

DEFAULT_MODEL = "smollm2-135m"  # the same as bulkgen.model.hub.DEFAULT_MODEL


def _version() -> str:
    from bulkgen.pipeline import bulkgen_version

    return bulkgen_version()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bulkgen", message="bulkgen %(version)s")
def main() -> None:
    """bulkgen: offline bulk generation for LLMs."""


def _use_recipe(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from bulkgen.recipes import use_recipe

    use_recipe(ctx, param, value)


@main.command(no_args_is_help=True)
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option(
    "--recipe",
    metavar="FILE.yaml",
    is_eager=True,
    expose_value=False,
    callback=_use_recipe,
    help="Take this run's options from a recipe: a YAML file whose fields are these flags with "
    "underscores (max_tokens: 64), plus inputs, description and score. Flags given here "
    "override its fields; its relative paths are relative to its folder.",
)
@click.option(
    "--model",
    "-m",
    default=DEFAULT_MODEL,
    show_default=True,
    help="A local model folder, a Hugging Face Hub id (org/name) or an alias "
    "(list them with `bulkgen models`).",
)
@click.option(
    "--out",
    "-o",
    required=True,
    type=click.Path(file_okay=False),
    help="Output folder for part-NNNNN shards, job.json and stats.json. Rerunning the same "
    "command on it resumes the job.",
)
@click.option(
    "--prompt-column",
    default="prompt",
    show_default=True,
    help="Input column holding the prompt: a string, or a list of token ids used as they are "
    "(the output's prompt column then holds their decoded text).",
)
@click.option(
    "--prompt-template",
    metavar="TEMPLATE",
    default=None,
    help="Render each row's prompt from its columns with this Jinja template (or @FILE holding "
    "one), e.g. 'Explain {{ topic }} to {{ audience }}.'; the prompt column is then optional. "
    "A row the template fails on (a missing column, say) is an error record.",
)
@click.option(
    "--id-column",
    default="id",
    show_default=True,
    help="Input column holding row ids. Without one, a row's id is '<file name>:<row number>'.",
)
@click.option(
    "--keep-columns",
    default="",
    metavar="A,B",
    help="Input columns to copy into the output, comma-separated.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl", "openai"]),
    default="parquet",
    show_default=True,
    help="Shard file format. openai: JSONL lines in the OpenAI Batch API's output shape, all "
    "samples of a row as the choices of one line.",
)
@click.option(
    "--shard-size",
    type=int,
    default=1000,
    show_default=True,
    help="Rows per output shard. A killed run loses at most the rows of its unfinished shard.",
)
@click.option(
    "--max-tokens",
    type=int,
    default=256,
    show_default=True,
    help="Most tokens to generate per row.",
)
@click.option(
    "--temperature",
    type=float,
    default=0.0,
    show_default=True,
    help="Sampling temperature; 0 is greedy decoding, the default.",
)
@click.option(
    "--top-p",
    type=float,
    default=1.0,
    show_default=True,
    help="Nucleus sampling: keep the most likely tokens up to this total probability (1.0: off).",
)
@click.option(
    "--top-k",
    type=int,
    default=0,
    show_default=True,
    help="Keep only the k most likely tokens (0: off).",
)
@click.option(
    "--min-p",
    type=float,
    default=0.0,
    show_default=True,
    help="Drop tokens less likely than min-p times the most likely one (0.0: off).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Seed for sampling. Each row's seed comes "
    "from it and the row's id, so a row samples the same text on a rerun.",
)
@click.option(
    "--chat-template/--no-chat-template",
    "--chat",
    default=None,
    help="Wrap each text prompt as "
    "a user message with the model's chat template. Default: when the model has one. "
    "A messages column is always rendered with the template.",
)
# ---- chat, samples, stop strings, logprobs, prefix cache (issue 5) ----
@click.option(
    "--messages-column",
    default="messages",
    show_default=True,
    help="Input column holding a conversation (a list of {role, content}), rendered with the "
    "model's chat template; used for rows whose prompt column is missing or null.",
)
@click.option(
    "--system",
    metavar="TEXT",
    default=None,
    help="A system message before each conversation or templated prompt (unless a "
    "conversation starts with its own).",
)
@click.option(
    "--n",
    type=int,
    default=1,
    show_default=True,
    help="Completions per row; output rows carry a sample column (0..n-1) and the row's id.",
)
@click.option(
    "--stop",
    multiple=True,
    metavar="STR",
    help="End a completion at this string, which is left out of the text (finish_reason "
    "stop). Repeatable; a row's stop column replaces them for that row.",
)
@click.option(
    "--stop-token-id",
    type=int,
    multiple=True,
    metavar="N",
    help="End a completion at this token id (kept in token counts). Repeatable.",
)
@click.option(
    "--logprobs",
    type=int,
    default=None,
    metavar="K",
    help="Store each generated token's logprob (logprobs column) and the K most likely "
    "alternatives per position (top_logprobs); 0 stores the sampled token's only.",
)
@click.option(
    "--prefix-cache/--no-prefix-cache",
    default=True,
    show_default=True,
    help="Reuse the KV cache of prompt prefixes shared between rows (a system prompt, "
    "few-shot examples, the n samples of a row); outputs are the same either way.",
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "bfloat16", "float16", "float32"]),
    default="auto",
    show_default=True,
    help="Weight and activation type; auto is bfloat16 on CUDA, float32 on CPU.",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="cuda, cuda:N, cpu, or auto (CUDA when available).",
)
@click.option(
    "--max-num-seqs",
    type=int,
    default=None,
    help="Most requests the engine runs at once [engine default: 256].",
)
@click.option(
    "--max-batch-tokens",
    type=int,
    default=None,
    help="Most tokens in one engine step, prefill chunks included [engine default: 2048].",
)
@click.option(
    "--kv-memory",
    type=float,
    default=None,
    help="Fraction of free GPU memory for the KV cache [engine default: 0.9].",
)
@click.option(
    "--max-model-len",
    type=int,
    default=None,
    help="Longest prompt plus completion, in tokens [default: the model's context]; a smaller "
    "one leaves the KV cache room for more requests at once.",
)
@click.option(
    "--load-format",
    type=click.Choice(["auto", "safetensors", "dummy"]),
    default="auto",
    show_default=True,
    help="dummy: random weights of the model's shape, to measure speed without the weights.",
)
@click.option(
    "--sync",
    is_flag=True,
    help="Run the engine loop without CPU/GPU overlap, to "
    "compare against the default asynchronous loop.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Delete the shards of an earlier job in --out "
    "and start over, even if its settings differ.",
)
# ---- scaling out (issue 6) ----
@click.option(
    "--data-parallel",
    "--gpus",
    "data_parallel",
    metavar="N|all",
    default=None,
    help="Run N engine workers, one per GPU (all: every GPU; without GPUs, N CPU workers). Rows "
    "are shared out by a hash of their id; each worker writes its own part-wII-* shards, and a "
    "rerun resumes with any N.",
)
@click.option(
    "--ray",
    "ray_address",
    metavar="[ADDRESS]",
    is_flag=False,
    flag_value="",
    default=None,
    help="Run the workers as Ray actors (pip install 'bulkgen[ray]') on the cluster at ADDRESS "
    "(auto, ray://HOST:10001); with no ADDRESS, RAY_ADDRESS's cluster or a local Ray. --out "
    "must be a folder every node shares.",
)
def run(inputs, model, out, prompt_column, prompt_template, id_column, keep_columns, fmt,
        shard_size, max_tokens, temperature, top_p, top_k, min_p, seed, chat_template,
        dtype, device, max_num_seqs, max_batch_tokens, kv_memory, sync, quiet,
        overwrite, **generation) -> None:  # fmt: skip
    """Generate a completion for every row of INPUT... and write sharded results to --out.

    INPUT is a .jsonl, .jsonl.gz or .parquet file, a folder or quoted glob of them, or a folder
    written by the datasets library's save_to_disk. Rows that cannot be used (bad JSON, a null,
    empty or non-string prompt, a prompt longer than the model's context) are written as error
    records and the run goes on.
    """
    from bulkgen.config import SamplingParams
    from bulkgen.errors import UserError
    from bulkgen.pipeline import run as run_pipeline
    from bulkgen.run_config import RunConfig
    from bulkgen.text.prompt_template import template_source

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
    except UserError as e:  # an unreadable --prompt-template file
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    try:
        if workers is None and ray_address is None:
            stats = run_pipeline(config)
        else:
            from bulkgen.parallel import run_parallel

            stats = run_parallel(config, workers, ray_address)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo(f"interrupted: rerun the same command to resume into {out}", err=True)
        sys.exit(130)
    if not quiet:
        this = stats["this_run"]
        click.echo(
            f"{this['rows']} rows ({this['errors']} errors) written to {out} in "
            f"{stats['wall_time_s']:.1f} s, {stats['generated_tokens_per_s']:,.0f} generated "
            f"tokens/s; {stats['rows']} rows in all",
            err=True,
        )
    from bulkgen.recipes import after_run

    try:
        after_run(click.get_current_context(), out, quiet)  # a recipe's score, if it has one
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


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
def score(results, reference_column, baseline) -> None:
    """Score the answers in RESULTS by exact match against a reference column.

    The answer is extracted from each row's text (the number after "answer is", else the last
    number, for a numeric reference; the first clause, normalised, for any other) and the
    accuracy merged into RESULTS/stats.json under "score".
    """
    from bulkgen.errors import UserError
    from bulkgen.score import score_folder, summary

    try:
        section = score_folder(results, reference_column, baseline)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    for line in summary(section):
        click.echo(line)


if __name__ == "__main__":
    main()
