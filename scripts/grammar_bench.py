"""Mask-fill time of structured output on the host: one JSON schema of 8 fields, a batch of rows.

Each row walks the grammar by sampling uniformly among its allowed tokens (what dummy weights
do: the grammar does real work at every step); a row whose grammar completes starts over.
Prints one JSON line: compile ms, the batch fill per step (GrammarCompiler.fill_masks over all
rows: xgrammar's threads, then the JSON rows' control-character filter) and the fill of one row
alone (one thread), in microseconds. `--library llguidance` measures llguidance the same way
(LLExecutor for the batch, one matcher per row) on the same schema, JSON layout and walk: the
comparison issue 12 asked for before choosing a library.

    python scripts/grammar_bench.py --tokenizer .carry/tokenizer.json --rows 256 --steps 40
    python scripts/grammar_bench.py --library llguidance   # pip install llguidance
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import numpy as np

from bulkgen.config import SamplingParams
from bulkgen.engine.grammar import GrammarCompiler

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "level": {"enum": ["low", "mid", "high"]},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "email", "tags", "level", "score", "active", "address"],
    "additionalProperties": False,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=".carry/tokenizer.json")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--library", choices=("xgrammar", "llguidance"), default="xgrammar")
    args = ap.parse_args()
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer)
    if args.library == "llguidance":
        print(json.dumps(llguidance_bench(tok, args)))
        return
    compiler = GrammarCompiler(tok, args.vocab, [128001, 128009])
    params = SamplingParams(json_schema=json.dumps(SCHEMA))
    t0 = time.perf_counter()
    compiler.matcher(params)
    compile_ms = 1e3 * (time.perf_counter() - t0)
    requests = [
        SimpleNamespace(matcher=compiler.matcher(params), output_ids=[], is_finished=False)
        for _ in range(args.rows)
    ]
    sampled = [SimpleNamespace(request=r) for r in requests]
    words = np.empty((args.rows, compiler.num_words), dtype=np.int32)
    rng = np.random.default_rng(0)
    batch_s, row_s, serial_s = [], [], []
    for step in range(args.steps):
        # Even steps fill the batch at once, odd ones row by row: each state is filled once.
        if step % 2 == 0:
            t = time.perf_counter()
            compiler.fill_masks(sampled, words)
            batch_s.append(time.perf_counter() - t)
        else:
            t_step = time.perf_counter()
            for i, req in enumerate(requests):
                t = time.perf_counter()
                req.matcher.fill_mask(words[i])
                row_s.append(time.perf_counter() - t)
            serial_s.append(time.perf_counter() - t_step)
        for i, req in enumerate(requests):
            token = walk(words[i], args.vocab, rng)
            assert req.matcher.advance(token), req.matcher.error
            req.output_ids.append(token)
            if req.matcher.is_done:
                req.matcher.rollback(len(req.output_ids))
                req.output_ids = []
    result = summary("xgrammar", args, compile_ms, batch_s, row_s, serial_s)
    print(json.dumps(result))


def walk(words: np.ndarray, vocab: int, rng: np.random.Generator) -> int:
    """A token allowed by one row's mask, uniformly (what dummy weights do under a grammar)."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
    return int(rng.choice(np.flatnonzero(bits)))


def llguidance_bench(tok, args) -> dict:
    """The same measurement with llguidance (the library bulkgen used before xgrammar): compile,
    batch fill on its threads (LLExecutor), one row alone; same schema, layout and walk."""
    import llguidance
    import llguidance.hf

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=args.vocab, eos_token=[128001, 128009])
    layout = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), overrides=layout)
    proto = llguidance.LLMatcher(lltok, grammar, log_level=0)
    compile_ms = 1e3 * (time.perf_counter() - t0)
    matchers = [proto.deep_copy() for _ in range(args.rows)]
    executor = llguidance.LLExecutor()
    words = np.empty((args.rows, (args.vocab + 31) // 32), dtype=np.int32)
    row_bytes = words.shape[1] * 4
    rng = np.random.default_rng(0)
    batch_s, row_s, serial_s = [], [], []
    for step in range(args.steps):
        if step % 2 == 0:
            t = time.perf_counter()
            rows = [(m, i) for i, m in enumerate(matchers)]
            executor.unsafe_compute_mask_ptr(rows, words.ctypes.data, row_bytes, len(words))
            batch_s.append(time.perf_counter() - t)
        else:
            t_step = time.perf_counter()
            for i, m in enumerate(matchers):
                t = time.perf_counter()
                m.unsafe_compute_mask_ptr(words[i].ctypes.data, row_bytes)
                row_s.append(time.perf_counter() - t)
            serial_s.append(time.perf_counter() - t_step)
        for i, m in enumerate(matchers):
            assert m.consume_token(walk(words[i], args.vocab, rng)), m.get_error()
            if m.is_stopped():
                matchers[i] = proto.deep_copy()
    return summary("llguidance", args, compile_ms, batch_s, row_s, serial_s)


def summary(library: str, args, compile_ms: float, batch_s, row_s, serial_s) -> dict:
    return {
        "bench": "grammar_mask_fill",
        "library": library,
        "rows": args.rows,
        "steps": args.steps,
        "vocab": args.vocab,
        "compile_ms": round(compile_ms, 2),
        "batch_fill_ms_per_step_median": round(1e3 * statistics.median(batch_s), 3),
        "batch_fill_us_per_row_median": round(1e6 * statistics.median(batch_s) / args.rows, 2),
        "serial_fill_ms_per_step_median": round(1e3 * statistics.median(serial_s), 3),
        "row_fill_us_median": round(1e6 * statistics.median(row_s), 2),
        "row_fill_us_p99": round(1e6 * sorted(row_s)[int(0.99 * len(row_s))], 2),
    }


if __name__ == "__main__":
    main()
