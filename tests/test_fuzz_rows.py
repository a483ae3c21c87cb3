"""Fuzz: thousands of rows of every kind of bad value, mixed with good ones, through `bulkgen run`.

Rows are drawn from a fixed seed. Every input row must come back exactly once, by its id or, for
a row whose id is bad or repeated or that cannot be parsed, by its default id `<file>:<row>`;
bad rows as error records, good rows generated; and the run must exit 0. The real engine runs on
the tiny test model with max_tokens 2.
"""

from __future__ import annotations

import collections
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from bulkgen.cli import main

SEED, JSONL_ROWS, PARQUET_ROWS = 20261130, 2000, 1000
GOOD_PROMPTS = ["What is the capital of France?", "Write a haiku.", "def add(a, b):", "Bonjour"]
# A bad row's raw JSON (after the id field); a row-level problem the reader must catch.
BAD_BODIES = [
    '"prompt": null',
    '"prompt": ""',
    '"prompt": 3.5',
    '"prompt": true',
    '"prompt": {}',
    '"prompt": []',
    '"prompt": [1.5]',
    '"prompt": [-1]',
    '"prompt": [1000000]',
    '"prompt": ["a"]',
    '"prompt": "lone \\ud800 surrogate"',
    '"prompt": "\\udfff"',
    '"prompt": ' + "[" * 40 + "]" * 40,
    '"prompt": "' + "word " * 3000 + '"',  # longer than the model's context
    '"messages": null',
    '"messages": []',
    '"messages": "hi"',
    '"messages": [{"role": 1}]',
    '"messages": [{"role": "user", "content": "\\ud800"}]',
    '"messages": [{"role": "user"}]',
    '"messages": [{"role": "user", "content": [{"type": "image_url"}]}]',
    '"prompt": "a", "temperature": NaN',
    '"prompt": "a", "temperature": Infinity',
    '"prompt": "a", "temperature": -1',
    '"prompt": "a", "temperature": "hot"',
    '"prompt": "a", "temperature": true',
    '"prompt": "a", "top_k": 1e20',
    '"prompt": "a", "top_k": 9223372036854775808',
    '"prompt": "a", "top_k": -5',
    '"prompt": "a", "top_k": 1.5',
    '"prompt": "a", "top_p": 0',
    '"prompt": "a", "top_p": NaN',
    '"prompt": "a", "min_p": -1',
    '"prompt": "a", "max_tokens": 0',
    '"prompt": "a", "max_tokens": 1099511627776',
    '"prompt": "a", "max_tokens": "x"',
    '"prompt": "a", "seed": -1',
    '"prompt": "a", "seed": 18446744073709551616',
    '"prompt": "a", "stop": 5',
    '"prompt": "a", "stop": ["\\ud800"]',
    '"text": "no prompt"',
    '"prompt": "a", "meta": ' + "[" * 50 + "]" * 50,
    '"prompt": "a", "meta": "\\ud800"',
]
# Whole lines that are not a usable object: the row is found by its default id.
BAD_LINES = [
    b"{broken", b"[1, 2]", b'"just a string"', b"null", b"42", b'{"prompt": "\xff\xfe"}',
    b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"prompt": 1' + b"0" * 5000 + b"}",
]  # fmt: skip
BAD_IDS = ['"id\\ud800"', '{"a": 1}', "[1]", '""', "true", "1.5"]
GOOD_EXTRAS = ['"temperature": 0.7, "seed": 5', '"top_k": 3', '"stop": ["x"]', '"max_tokens": 1',
               '"meta": {"a": [1, 2]}', '"meta": 7', '"meta": "text"', '"top_p": 0.9']  # fmt: skip


def fuzz_jsonl(rng: random.Random, count: int) -> tuple[list[bytes], list[tuple[str, bool]]]:
    """The file's lines and, per row, (the id its record must have, whether it is an error)."""
    lines: list[bytes] = []
    expected: list[tuple[str, bool]] = []
    good_ids: list[str] = []
    for i in range(count):
        default, kind = f"fuzz:{i}", rng.random()
        if rng.random() < 0.02:
            lines.append(b"   ")  # blank lines are not rows
        if kind < 0.1:
            lines.append(rng.choice(BAD_LINES))
            expected.append((default, True))
        elif kind < 0.2:
            lines.append(f'{{"id": {rng.choice(BAD_IDS)}, "prompt": "hi"}}'.encode())
            expected.append((default, True))
        elif kind < 0.3 and good_ids:
            lines.append(f'{{"id": "{rng.choice(good_ids)}", "prompt": "again"}}'.encode())
            expected.append((default, True))
        elif kind < 0.6:
            lines.append(f'{{"id": "r{i}", {rng.choice(BAD_BODIES)}}}'.encode())
            expected.append((f"r{i}", True))
        else:
            body = {"id": f"r{i}", "prompt": rng.choice(GOOD_PROMPTS)}
            if kind > 0.9:
                body = {
                    "id": i,
                    "messages": [{"role": "user", "content": rng.choice(GOOD_PROMPTS)}],
                }
            text = json.dumps(body)
            if rng.random() < 0.3:
                text = text[:-1] + ", " + rng.choice(GOOD_EXTRAS) + "}"
            lines.append(text.encode())
            expected.append((str(body["id"]), False))
            good_ids.append(str(body["id"]))
    return lines, expected


def fuzz_parquet(rng: random.Random, count: int) -> tuple[pa.Table, list[tuple[str, bool]]]:
    ids, prompts, temps, top_ks, metas, expected = [], [], [], [], [], []
    ids_used: list[str] = []
    for i in range(count):
        kind = rng.random()
        row_id, prompt, temp, top_k, bad = f"q{i}", rng.choice(GOOD_PROMPTS), None, None, False
        if kind < 0.1:  # no id and no prompt, or an id an earlier row has
            row_id, bad = (rng.choice(ids_used) if ids_used and rng.random() < 0.5 else None), True
            prompt = None if row_id is None else prompt
        elif kind < 0.2:
            temp, bad = rng.choice([float("nan"), float("inf"), -1.0]), True
        elif kind < 0.3:
            top_k, bad = rng.choice([2**62, -5, 2**31]), True
        elif kind < 0.4:
            prompt, bad = rng.choice([None, "", "word " * 3000]), True
        ids.append(row_id)
        prompts.append(prompt)
        temps.append(temp)
        top_ks.append(top_k)
        metas.append(rng.choice([None, "x", "y"]))
        repeated = row_id is not None and row_id != f"q{i}"
        expected.append((f"fuzz:{i}" if row_id is None or repeated else row_id, bad))
        if row_id is not None and not repeated:
            ids_used.append(row_id)
    table = pa.table({"id": ids, "prompt": prompts, "temperature": pa.array(temps, pa.float64()),
                      "top_k": pa.array(top_ks, pa.int64()), "meta": metas})  # fmt: skip
    return table, expected


def run_job(inputs, out, model) -> list[dict]:
    args = ["run", *map(str, inputs), "-m", str(model), "-o", str(out), "-q", "--max-tokens", "2",
            "--keep-columns", "meta", "--max-model-len", "128", "--shard-size", "500"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    # Every bad value is caught where it is read: no stage had to guard against one.
    assert json.loads((out / "stats.json").read_text())["row_faults"] == 0
    return [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def check(rows: list[dict], expected: list[tuple[str, bool]]) -> None:
    counts = collections.Counter(r["id"] for r in rows)
    assert [k for k, n in counts.items() if n > 1] == []
    assert sorted(counts) == sorted(row_id for row_id, _ in expected)
    errors = {r["id"]: r["error"] for r in rows}
    wrong = [(i, errors[i]) for i, bad in expected if (errors[i] is not None) != bad]
    assert wrong == []
    assert all(r["error"] or r["completion_tokens"] >= 1 for r in rows)


def test_fuzzed_jsonl_rows_each_come_back_exactly_once(tmp_path, tiny_model_dir):
    lines, expected = fuzz_jsonl(random.Random(SEED), JSONL_ROWS)
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    check(run_job([path], tmp_path / "out", tiny_model_dir), expected)


def test_fuzzed_parquet_rows_each_come_back_exactly_once(tmp_path, tiny_model_dir):
    table, expected = fuzz_parquet(random.Random(SEED), PARQUET_ROWS)
    path = tmp_path / "fuzz.parquet"
    pq.write_table(table, path)
    check(run_job([path], tmp_path / "out", tiny_model_dir), expected)
