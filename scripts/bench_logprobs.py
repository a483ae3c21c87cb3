"""Host cost of --logprobs per generated token: naming (Detokenize) and the Parquet columns.

Both run on threads that share the interpreter (the GIL) with the engine thread, so their
Python time is time the engine loop may wait. A shard batch of 64 rows x 544 tokens x top-5 with
random ids, as the engine gives them; naming is timed cold (every id new to the Detokenize's
text cache) and warm (later batches with the same ids); each warm figure is the best of 3.

    python scripts/bench_logprobs.py --tokenizer .carry/tokenizer.json
"""

from __future__ import annotations

import argparse
import random
import time

from transformers import PreTrainedTokenizerFast

from bulkgen.io.writer import logprob_columns
from bulkgen.row import Row
from bulkgen.text.stage import Detokenize


def batch(rows: int, tokens: int, k: int, seed: int) -> list[Row]:
    r = random.Random(seed)
    out = []
    for i in range(rows):
        row = Row(id=str(i), prompt="x")
        row.token_ids = [r.randrange(1000, 120000) for _ in range(tokens)]
        row.logprobs = [-r.random() for _ in range(tokens)]
        pairs = [
            [(r.randrange(1000, 120000), -r.random()) for _ in range(k)] for _ in range(tokens)
        ]
        row.top_logprobs = pairs
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a tokenizer.json file")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=544)
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    det = Detokenize(PreTrainedTokenizerFast(tokenizer_file=args.tokenizer))
    n = args.rows * args.tokens
    logprob_columns(batch(1, 1, 1, seed=1))  # pyarrow's first conversion imports its helpers
    rows = batch(args.rows, args.tokens, args.k, seed=0)
    print(f"naming, cold: {timed(det._name_tokens, rows) / n * 1e6:.2f} us/token")
    warm = min(timed(det._name_tokens, batch(args.rows, args.tokens, args.k, 0)) for _ in range(3))
    print(f"naming, warm: {warm / n * 1e6:.2f} us/token")
    arrow = min(timed(logprob_columns, rows) for _ in range(3))
    print(f"arrow columns: {arrow / n * 1e6:.2f} us/token")


def timed(fn, rows: list[Row]) -> float:
    start = time.perf_counter()
    fn(rows)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
