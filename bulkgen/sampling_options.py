"""The sampling options of `bulkgen run` (length, temperature, filters, penalties, seed):
run_options.py lists them with the others, in this order."""

from __future__ import annotations

import click

SAMPLING_OPTIONS = [
    click.option(
        "--max-tokens",
        type=int,
        default=256,
        show_default=True,
        help="Most tokens to generate per row.",
    ),
    click.option(
        "--temperature",
        type=float,
        default=0.0,
        show_default=True,
        help="Sampling temperature; 0 is greedy decoding, the default.",
    ),
    click.option(
        "--top-p",
        type=float,
        default=1.0,
        show_default=True,
        help="Nucleus sampling: keep the most likely tokens up to this total probability "
        "(1.0: off).",
    ),
    click.option(
        "--top-k",
        type=int,
        default=0,
        show_default=True,
        help="Keep only the k most likely tokens (0: off).",
    ),
    click.option(
        "--min-p",
        type=float,
        default=0.0,
        show_default=True,
        help="Drop tokens less likely than min-p times the most likely one (0.0: off).",
    ),
    click.option(
        "--repetition-penalty",
        type=float,
        default=1.0,
        show_default=True,
        help="Hugging Face's repetition_penalty: the logit of a token in the prompt or the "
        "completion is divided by it if positive, else multiplied (1.0: off).",
    ),
    click.option(
        "--presence-penalty",
        type=float,
        default=0.0,
        show_default=True,
        help="Subtract this from the logit of every token already in the completion, as OpenAI's "
        "presence_penalty (-2 to 2; 0.0: off).",
    ),
    click.option(
        "--frequency-penalty",
        type=float,
        default=0.0,
        show_default=True,
        help="Subtract this times its count in the completion from each token's logit, as "
        "OpenAI's frequency_penalty (-2 to 2; 0.0: off).",
    ),
    click.option(
        "--seed",
        type=int,
        default=None,
        help="Seed for sampling. Each row's seed comes "
        "from it and the row's id, so a row samples the same text on a rerun.",
    ),
]
