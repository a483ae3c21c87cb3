"""Logprobs as flat columns: named once per distinct id, written as the same Arrow and JSON.

Row.token_logprobs holds a row's top-k entries flat (engine/token_logprobs.py), text/stage.py
names them (Row.top_texts), io/writer.py assembles the list<list<struct>> column from offsets;
the oracle is the per-entry dict form written before.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.engine.token_logprobs import TokenLogprobs
from bulkgen.guard import RowGuard
from bulkgen.io.writer import ShardWriter, logprob_columns
from bulkgen.row import Row
from bulkgen.text.stage import Detokenize
from bulkgen.text.stop import keep_first_tokens

TOP = pa.list_(pa.list_(pa.struct([("token_id", pa.int64()), ("token", pa.string()),
                                   ("logprob", pa.float64())])))  # fmt: skip


def engine_row(name: str, ids: list[int], k: int) -> Row:
    """A row as the engine hands it over: per position, k (token_id, logprob) pairs."""
    row = Row(id=name, prompt="p", prompt_text="p", token_ids=ids, finish_reason="length")
    row.text = "t"
    chosen = [-0.25 * (p + 1) for p in range(len(ids))]
    pairs = [[(t + j, -0.5 * j - p) for j in range(k)] for p, t in enumerate(ids)]
    row.token_logprobs = TokenLogprobs.from_pairs(chosen, pairs, k)
    return row


def dict_form(row: Row) -> list[list[dict]]:
    return row.top_dicts()


def mixed_rows(tokenizer) -> list[Row]:
    """Rows of K 3 and K 0, one without tokens, and an error row (no logprob columns)."""
    rows = [engine_row("k3", [5, 9, 5, 40], 3), engine_row("k0", [7, 8], 0)]
    rows += [engine_row("empty", [], 2), Row(id="bad", prompt="p", error="boom")]
    Detokenize(tokenizer)(rows)
    return rows


def test_naming_gives_each_token_its_own_text_and_keeps_the_pairs(tiny_tokenizer):
    rows = mixed_rows(tiny_tokenizer)
    k3 = rows[0]
    assert k3.token_texts == [tiny_tokenizer.decode([t]) for t in k3.token_ids]
    assert dict_form(k3)[1] == [
        {"token_id": 9 + j, "token": tiny_tokenizer.decode([9 + j]), "logprob": -0.5 * j - 1}
        for j in range(3)
    ]
    assert dict_form(rows[1]) == [[], []] and rows[2].top_texts == []


def test_each_distinct_id_is_decoded_once_across_batches(tiny_tokenizer):
    detok = Detokenize(tiny_tokenizer)
    decode, asked = detok.decode, []
    detok.decode = lambda ids, skip=True: (
        asked.append(sorted(i for [i] in ids)) or decode(ids, skip)
    )
    detok._name_tokens([engine_row("a", [5, 9, 5], 2)])
    detok._name_tokens([engine_row("b", [9, 11], 2), engine_row("c", [5], 1)])
    detok._name_tokens([engine_row("d", [6, 10], 1)])
    assert asked == [[5, 6, 9, 10], [11, 12]], "one batch call per naming, new ids only"


def test_a_rerun_by_the_guard_names_a_row_once(tiny_tokenizer):
    detok = Detokenize(tiny_tokenizer)
    expected = [engine_row("a", [5, 9], 2), engine_row("b", [7], 1)]
    detok(expected)
    rows = [engine_row("a", [5, 9], 2), engine_row("b", [7], 1)]

    def fails_on_the_batch(batch: list[Row]) -> None:
        detok(batch)  # names the rows, then the batch fails: the guard reruns each row alone
        if len(batch) > 1:
            raise RuntimeError("a batch-only failure")

    guard = RowGuard("the detokenizer")
    guard(fails_on_the_batch, rows)
    assert guard.faults == 0
    named = [(r.token_logprobs, r.top_texts, r.token_texts) for r in rows]
    assert named == [(r.token_logprobs, r.top_texts, r.token_texts) for r in expected]


def test_cutting_a_named_row_cuts_its_texts_and_entries(tiny_tokenizer):
    row = engine_row("a", [5, 9, 5, 40], 3)
    Detokenize(tiny_tokenizer)([row])
    whole = dict_form(row)
    keep_first_tokens(row, 2)
    assert (row.token_ids, len(row.token_logprobs), len(row.token_texts)) == ([5, 9], 2, 2)
    assert (
        dict_form(row) == whole[:2] and len(row.top_texts) == len(row.token_logprobs.top_ids) == 6
    )


def test_the_arrow_columns_equal_those_of_the_dict_form(tiny_tokenizer):
    rows = mixed_rows(tiny_tokenizer)
    logprobs, top = logprob_columns(rows)
    assert top.type == TOP and logprobs.type == pa.list_(pa.float64())
    assert top.equals(
        pa.array([dict_form(r) if r.top_texts is not None else None for r in rows], TOP)
    )
    chosen = [r.token_logprobs.chosen.tolist() if r.top_texts is not None else None for r in rows]
    assert logprobs.equals(pa.array(chosen, pa.list_(pa.float64())))
    assert top.null_count == logprobs.null_count == 1


def test_parquet_and_jsonl_shards_hold_the_same_logprobs(tmp_path, tiny_tokenizer):
    written = {}
    for fmt in ("parquet", "jsonl"):
        out = tmp_path / fmt
        out.mkdir()
        writer = ShardWriter(out, fmt, shard_size=10, logprobs=True)
        writer.add(mixed_rows(tiny_tokenizer))
        writer.flush()
        path = out / writer.shards[0]
        if fmt == "parquet":
            written[fmt] = pq.read_table(path).to_pylist()
        else:
            written[fmt] = [json.loads(line) for line in path.read_text().splitlines()]
    expected = [
        dict_form(r) if r.top_texts is not None else None for r in mixed_rows(tiny_tokenizer)
    ]
    for fmt, records in written.items():
        assert [r["top_logprobs"] for r in records] == expected, fmt
        assert (
            records[0]["logprobs"] == [-0.25, -0.5, -0.75, -1.0] and records[3]["logprobs"] is None
        )


def test_the_first_shard_imports_nothing_while_the_engine_runs(tmp_path):
    """pyarrow's first conversion imports modules (0.2 s holding the GIL): ShardWriter takes it
    when it is built, before rows flow."""
    code = (
        "import sys\nfrom bulkgen.io.writer import ShardWriter\nfrom bulkgen.row import Row\n"
        f"w = ShardWriter({str(tmp_path)!r}, 'parquet', 1, logprobs=True)\n"
        "before = set(sys.modules)\nw._table([Row(id='a', prompt='p')])\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_named_rows_logprobs_hold_no_object_the_gc_tracks(tiny_tokenizer):
    """Naming adds texts; the numbers stay in untracked arrays, cut or not."""
    row = engine_row("a", [5, 9, 5, 40], 3)
    Detokenize(tiny_tokenizer)([row])
    keep_first_tokens(row, 3)
    assert len(row.token_logprobs) == 3
    assert not any(gc.is_tracked(a) for a in row.token_logprobs.columns())


def test_a_parquet_shard_is_byte_for_byte_that_of_the_dict_form(tmp_path, tiny_tokenizer):
    """The oracle: the same table converted from Python lists and dicts in one pyarrow call (how
    shards were written before the flat columns)."""
    writer = ShardWriter(tmp_path, "parquet", shard_size=10, logprobs=True)
    writer.add(mixed_rows(tiny_tokenizer))
    writer.flush()
    rows = mixed_rows(tiny_tokenizer)
    oracle = writer._table(rows).drop_columns(["logprobs", "top_logprobs"])
    chosen = [r.token_logprobs.chosen.tolist() if r.top_texts is not None else None for r in rows]
    oracle = oracle.append_column("logprobs", pa.array(chosen, pa.list_(pa.float64())))
    tops = [dict_form(r) if r.top_texts is not None else None for r in rows]
    oracle = oracle.append_column("top_logprobs", pa.array(tops, TOP))
    buffer = pa.BufferOutputStream()
    pq.write_table(oracle, buffer, compression="zstd")
    assert (tmp_path / writer.shards[0]).read_bytes() == buffer.getvalue().to_pybytes()


def test_a_jsonl_line_holds_the_logprobs_exactly(tmp_path, tiny_tokenizer):
    row = engine_row("a", [5, 9], 2)
    Detokenize(tiny_tokenizer)([row])
    writer = ShardWriter(tmp_path, "jsonl", shard_size=10, logprobs=True)
    writer.add([row])
    writer.flush()
    t = {i: json.dumps(tiny_tokenizer.decode([i]), ensure_ascii=False) for i in (5, 6, 9, 10)}
    expected = (
        f'{{"id": "a", "prompt": "p", "text": {json.dumps(row.text, ensure_ascii=False)}, '
        '"finish_reason": "length", "error": null, '
        '"prompt_tokens": 0, "completion_tokens": 2, "logprobs": [-0.25, -0.5], "top_logprobs": '
        f'[[{{"token_id": 5, "token": {t[5]}, "logprob": -0.0}}, '
        f'{{"token_id": 6, "token": {t[6]}, "logprob": -0.5}}], '
        f'[{{"token_id": 9, "token": {t[9]}, "logprob": -1.0}}, '
        f'{{"token_id": 10, "token": {t[10]}, "logprob": -1.5}}]]}}\n'
    )
    assert (tmp_path / writer.shards[0]).read_text() == expected
