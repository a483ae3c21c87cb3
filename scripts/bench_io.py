"""I/O throughput of `bulkgen run` without a model: reader -> tokenizer -> FakeEngine ->
detokenizer -> writer on a million generated rows. Prints one JSON line: rows/s and peak RSS.

    python scripts/bench_io.py [--rows 1000000] [--model smollm2-135m] [--input parquet]

The model is only used for its tokenizer and chat template; the engine stand-in answers every
row with the same fixed tokens after one step.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.config import SamplingParams
from bulkgen.engine.fake import FakeEngine
from bulkgen.pipeline import run
from bulkgen.preflight import model_folder, tokenizer_of
from bulkgen.run_config import RunConfig

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"


def write_input(path: Path, rows: int, fmt: str) -> None:
    """rows prompts, each an example prompt made unique by its row number, written in chunks."""
    base = [json.loads(line)["prompt"] for line in EXAMPLES.read_text().splitlines()]
    chunk = 100_000
    if fmt == "parquet":
        schema = pa.schema([("id", pa.string()), ("prompt", pa.string())])
        with pq.ParquetWriter(path, schema) as writer:
            for start in range(0, rows, chunk):
                idx = range(start, min(rows, start + chunk))
                prompts = [f"{base[i % len(base)]} (#{i})" for i in idx]
                writer.write_table(pa.table({"id": [f"r{i}" for i in idx], "prompt": prompts}))
    else:
        with open(path, "w") as f:
            for i in range(rows):
                f.write(json.dumps({"id": f"r{i}", "prompt": f"{base[i % len(base)]} (#{i})"}))
                f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--model", default="smollm2-135m", help="folder, alias or Hub id")
    parser.add_argument("--input", choices=["parquet", "jsonl"], default="parquet")
    parser.add_argument("--format", choices=["parquet", "jsonl"], default="parquet")
    parser.add_argument("--shard-size", type=int, default=10_000)
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--no-chat-template", action="store_true")
    args = parser.parse_args()

    model_dir = model_folder(args.model)
    tokenizer = tokenizer_of(model_dir)
    # A fixed answer of ordinary text tokens (ids of a real sentence, repeated as needed).
    sentence = tokenizer("The quick brown fox jumps over the lazy dog. ")["input_ids"]
    answer = (sentence * (args.completion_tokens // len(sentence) + 1))[: args.completion_tokens]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"prompts.{args.input}"
        write_input(path, args.rows, args.input)
        config = RunConfig(
            inputs=(str(path),),
            out=str(Path(tmp) / "out"),
            model=str(model_dir),
            format=args.format,
            shard_size=args.shard_size,
            sampling=SamplingParams(max_tokens=args.completion_tokens, temperature=0.0),
            chat_template=False if args.no_chat_template else None,
            quiet=True,
        )
        start = time.perf_counter()
        stats = run(config, lambda c: FakeEngine(c, steps=1, tokens=answer))
        seconds = time.perf_counter() - start
    assert stats["rows"] == args.rows, stats
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "bench": "io",
        "rows": args.rows,
        "input": args.input,
        "format": args.format,
        "chat_template": not args.no_chat_template,
        "prompt_tokens_per_row": round(stats["prompt_tokens"] / args.rows, 1),
        "completion_tokens_per_row": args.completion_tokens,
        "seconds": round(seconds, 2),
        "rows_per_s": round(args.rows / seconds),
        "peak_rss_mb": round(peak_rss_mb),
    }
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
