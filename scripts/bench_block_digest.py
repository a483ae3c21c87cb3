"""The prefix cache's cost per block: the blake2b key against the old unkeyed tuple hash.

Prints one JSON line per block size: median nanoseconds per block (timeit, 7 repeats) of
block_digest, of Python's tuple hash it replaced, and of a whole BlockManager.lookup() hit.

    python scripts/bench_block_digest.py
"""

from __future__ import annotations

import json
import statistics
import timeit

from bulkgen.engine.blocks import BlockManager, block_digest


def per_call_ns(fn, number: int) -> float:
    runs = timeit.repeat(fn, number=number, repeat=7)
    return round(statistics.median(runs) / number * 1e9, 1)


def measure(bs: int, num_blocks: int = 64) -> dict:
    tokens = tuple(range(100_000, 100_000 + bs))
    parent = block_digest(None, tokens)
    bm = BlockManager(num_blocks, bs, prefix_cache=True)
    prompt = [1000 + i for i in range(num_blocks * bs)]
    key = None
    for i, block in enumerate(bm.allocate(num_blocks)):
        key = bm.register(block, key, tuple(prompt[i * bs : (i + 1) * bs]))

    def lookup() -> None:
        bm.free(bm.lookup(prompt, num_blocks))

    return {
        "block_size": bs,
        "blake2b_ns_per_block": per_call_ns(lambda: block_digest(parent, tokens), 20_000),
        "tuple_hash_ns_per_block": per_call_ns(lambda: hash((12345, tokens)), 20_000),
        "lookup_hit_ns_per_block": round(per_call_ns(lookup, 200) / num_blocks, 1),
    }


def main() -> None:
    for bs in (16, 32, 64):
        print(json.dumps(measure(bs)))


if __name__ == "__main__":
    main()
