"""The KV cache options of `bulkgen run` (its element type and how an fp8 cache keeps each
sequence's first block): run_options.py lists them after --mixed-graphs; the engine reads their
values (model/attention/kv_pairs.py for the first block)."""

from __future__ import annotations

import click

KV_CACHE_OPTIONS = [
    click.option(
        "--kv-cache-dtype",
        type=click.Choice(["auto", "fp8", "int8"]),
        default="auto",
        show_default=True,
        help="KV cache element type. auto: the model's dtype; fp8: float8 e4m3 with a scale per "
        "layer, twice the tokens in the same memory (needs an Ada or Hopper GPU or newer); int8: "
        "int8 with a scale per token and KV head, about twice the tokens, more accurate than fp8 "
        "(top-1 agreement with bf16 0.97 against 0.95 on the demo model's long texts) at about "
        "0.9x its speed on an H200 (any device).",
    ),
    click.option(
        "--fp8-kv-pair-first-block/--no-fp8-kv-pair-first-block",
        default=None,
        help="With --kv-cache-dtype fp8 (off by default): each sequence's first KV block (its "
        "first 64 tokens with the GPU kernels, the attention sinks later tokens lean on) is kept "
        "at about 16-bit precision, as two e4m3 values in a second block of the cache. It helps "
        "short sequences most (demo model, top-1 agreement with bf16: 0.98 against 0.95 over "
        "58-token texts, 0.955 against 0.953 over 960-token ones) and costs a block a sequence "
        "(on one H200 the 1,000/1,000 FP8 benchmark ran 7% slower). An error with another "
        "cache dtype.",
    ),
]
