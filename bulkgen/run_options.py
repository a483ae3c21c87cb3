"""The options of `bulkgen run`: what each flag means, in the order `bulkgen run --help` lists
them. cli.py turns their values into a RunConfig."""

from __future__ import annotations

import click

from bulkgen.kv_cache_options import KV_CACHE_OPTIONS
from bulkgen.sampling_options import SAMPLING_OPTIONS
from bulkgen.scaling_options import SCALING_OPTIONS
from bulkgen.structured_options import STRUCTURED_OPTIONS

DEFAULT_MODEL = "smollm2-135m"  # the same as bulkgen.model.hub.DEFAULT_MODEL


def _use_recipe(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from bulkgen.recipes import use_recipe

    use_recipe(ctx, param, value)


class _SeqCount(click.ParamType):
    """A positive number of requests, or auto."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit() and int(text) >= 1:
            return int(text)
        self.fail(f"{value!r} is neither a number of requests >= 1 nor auto", param, ctx)


def run_options(command):
    """Apply the options to the `run` command function (click lists them top to bottom)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


_OPTIONS = [
    click.option(
        "--recipe",
        metavar="FILE.yaml",
        is_eager=True,
        expose_value=False,
        callback=_use_recipe,
        help="Take this run's options from a recipe: a YAML file whose fields are these flags with "
        "underscores (max_tokens: 64), plus inputs, description and score. Flags given here "
        "override its fields; its relative paths are relative to its folder.",
    ),
    click.option(
        "--model",
        "-m",
        default=DEFAULT_MODEL,
        show_default=True,
        help="A local model folder, a Hugging Face Hub id (org/name) or an alias "
        "(list them with `bulkgen models`).",
    ),
    click.option(
        "--out",
        "-o",
        required=True,
        type=click.Path(file_okay=False),
        help="Output folder for part-NNNNN shards, job.json and stats.json. Rerunning the same "
        "command on it resumes the job.",
    ),
    click.option(
        "--prompt-column",
        default="prompt",
        show_default=True,
        help="Input column holding the prompt: a string, or a list of token ids used as they are "
        "(the output's prompt column then holds their decoded text).",
    ),
    click.option(
        "--prompt-template",
        metavar="TEMPLATE",
        default=None,
        help="Render each row's prompt from its columns with this Jinja template (or @FILE holding "
        "one), e.g. 'Explain {{ topic }} to {{ audience }}.'; the prompt column is then optional. "
        "A row the template fails on (a missing column, say) is an error record.",
    ),
    click.option(
        "--id-column",
        default="id",
        show_default=True,
        help="Input column holding row ids. Without one, a row's id is '<file name>:<row number>'.",
    ),
    click.option(
        "--keep-columns",
        default="",
        metavar="A,B",
        help="Input columns to copy into the output, comma-separated.",
    ),
    click.option(
        "--format",
        "fmt",
        type=click.Choice(["parquet", "jsonl", "openai"]),
        default="parquet",
        show_default=True,
        help="Shard file format. openai: JSONL lines in the OpenAI Batch API's output shape, all "
        "samples of a row as the choices of one line.",
    ),
    click.option(
        "--shard-size",
        type=int,
        default=1000,
        show_default=True,
        help="Rows per output shard. A killed run loses at most the rows of its unfinished shard.",
    ),
    *SAMPLING_OPTIONS,  # --max-tokens .. --seed
    click.option(
        "--chat-template/--no-chat-template",
        "--chat",
        default=None,
        help="Wrap each text prompt as "
        "a user message with the model's chat template. Default: when the model has one. "
        "A messages column is always rendered with the template.",
    ),
    click.option(
        "--chat-template-file",
        metavar="FILE",
        default=None,
        help="Render chats with the Jinja chat template in FILE instead of the model's own.",
    ),
    # ---- chat, samples, stop strings, logprobs, prefix cache (issue 5) ----
    click.option(
        "--messages-column",
        default="messages",
        show_default=True,
        help="Input column holding a conversation (a list of {role, content}), rendered with the "
        "model's chat template; used for rows whose prompt column is missing or null.",
    ),
    click.option(
        "--system",
        metavar="TEXT",
        default=None,
        help="A system message before each conversation or templated prompt (unless a "
        "conversation starts with its own).",
    ),
    click.option(
        "--n",
        type=int,
        default=1,
        show_default=True,
        help="Completions per row; output rows carry a sample column (0..n-1) and the row's id.",
    ),
    click.option(
        "--stop",
        multiple=True,
        metavar="STR",
        help="End a completion at this string, which is left out of the text (finish_reason "
        "stop). Repeatable; a row's stop column replaces them for that row.",
    ),
    click.option(
        "--stop-token-id",
        type=int,
        multiple=True,
        metavar="N",
        help="End a completion at this token id (kept in token counts). Repeatable.",
    ),
    click.option(
        "--logprobs",
        type=int,
        default=None,
        metavar="K",
        help="Store each generated token's logprob (logprobs column) and the K most likely "
        "alternatives per position (top_logprobs); 0 stores the sampled token's only.",
    ),
    click.option(
        "--output-token-ids",
        is_flag=True,
        default=False,
        help="Keep each completion's generated token ids in a token_ids column (a list of ints; "
        "with --format openai, in each choice), for RL and distillation pipelines.",
    ),
    *STRUCTURED_OPTIONS,  # --json-schema, --json, --regex, --choice (issue 12)
    click.option(
        "--prefix-cache/--no-prefix-cache",
        default=True,
        show_default=True,
        help="Reuse the KV cache of prompt prefixes shared between rows (a system prompt, "
        "few-shot examples, the n samples of a row); with --batch-invariant the outputs are the "
        "same bits either way, without it they may round differently, as in another batch.",
    ),
    click.option(
        "--dtype",
        type=click.Choice(["auto", "bfloat16", "float16", "float32"]),
        default="auto",
        show_default=True,
        help="Weight and activation type; auto is bfloat16 on CUDA, float32 on CPU.",
    ),
    click.option(
        "--device",
        default="auto",
        show_default=True,
        help="cuda, cuda:N, cpu, or auto (CUDA when available).",
    ),
    click.option(
        "--max-num-seqs",
        type=_SeqCount(),
        default=None,
        help="Most requests the engine runs at once, or auto: chosen from the KV cache's size "
        "and the requests' lengths, up to 1024 [default: auto]. Either way a request is admitted "
        "only when the cache can hold it to its projected length (README: How it works).",
    ),
    click.option(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="Most tokens in one engine step, prefill chunks included [engine default: 8192].",
    ),
    click.option(
        "--kv-memory",
        type=float,
        default=None,
        help="Fraction for the KV cache of the GPU memory left once the weights, the largest "
        "steps' activations and the CUDA graphs' pools have theirs (stats.json's kv_sizing_gb) "
        "[engine default: 0.9].",
    ),
    click.option(
        "--max-model-len",
        type=int,
        default=None,
        help="Longest prompt plus completion, in tokens [default: the model's context]; a smaller "
        "one leaves the KV cache room for more requests at once.",
    ),
    click.option(
        "--load-format",
        type=click.Choice(["auto", "safetensors", "dummy"]),
        default="auto",
        show_default=True,
        help="dummy: random weights of the model's shape, to measure speed without the weights.",
    ),
    click.option(
        "--quantization",
        type=click.Choice(["fp8"]),
        default=None,
        help="fp8: quantize the weights to FP8 (e4m3) at load, with per-channel scales and "
        "activations quantized per token (embeddings and lm_head stay 16-bit); needs an Ada or "
        "Hopper GPU. FP8 checkpoints (compressed-tensors, fp8) load as FP8 without it.",
    ),
    click.option(
        "--fp8-fast-accum/--no-fp8-fast-accum",
        default=None,
        help="FP8 GEMMs sum in the tensor cores' own narrower accumulator (cuBLASLt's "
        "use_fast_accum, as vLLM's and TensorRT-LLM's FP8 GEMMs do): on by default with FP8 "
        "weights (5-11% faster bulk jobs on an H200, the same accuracy on the demo model); "
        "--no-fp8-fast-accum sums exactly.",
    ),
    click.option(
        "--mixed-graphs/--no-mixed-graphs",
        default=None,
        help="Steps with prompt tokens replay CUDA graphs of everything but attention, cutting "
        "their launch time (on an H200: 32 -> 10 ms a 2,048-token step): on by default on one "
        "GPU, off on the CPU and under tensor parallelism.",
    ),
    *KV_CACHE_OPTIONS,  # --kv-cache-dtype, --fp8-kv-pair-first-block
    click.option(
        "--batch-invariant",
        is_flag=True,
        help="Compute each row with kernels whose arithmetic does not depend on its batch, so a "
        "seeded or greedy row gives the same tokens alone, in any batch, after preemption and "
        "on a rerun (fixed-tiling Triton GEMMs and one attention kernel; slower; not with "
        "--tensor-parallel or FP8 weights).",
    ),
    click.option(
        "--sync",
        is_flag=True,
        help="Run the engine loop without CPU/GPU overlap, to "
        "compare against the default asynchronous loop.",
    ),
    click.option(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="Run only the first N rows of the inputs (to try a job on a sample); recorded in "
        "job.json, so a rerun with another limit is a changed job.",
    ),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary."),
    click.option(
        "--overwrite",
        is_flag=True,
        help="Delete the shards of an earlier job in --out "
        "and start over, even if its settings differ.",
    ),
    click.option(
        "--allow-changed-input",
        is_flag=True,
        help="Resume a job although an input file changed since it started (job.json records "
        "each file's size, time and a hash of its ends); rows are matched by id.",
    ),
    *SCALING_OPTIONS,
]
