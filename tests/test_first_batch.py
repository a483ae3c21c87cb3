"""The engine starts on a job's first rows early: the reader hands out a small first batch, and
the checks of token-id prompts run at C speed (same verdicts as before)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkgen.io.inputs import find_sources
from bulkgen.io.reader import FIRST_BATCH_ROWS, Reader
from bulkgen.io.validate import MAX_DEPTH, problem


def batch_sizes(path, **kw) -> list[int]:
    reader = Reader(find_sources([str(path)]), "prompt", "id", **kw)
    reader.check()
    return [len(batch) for batch in reader.batches()]


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_the_first_batch_is_small_and_the_rest_full(tmp_path, kind):
    prompts = [[5, 6, 7]] * 1500
    path = tmp_path / f"in.{kind}"
    if kind == "parquet":
        pq.write_table(pa.table({"prompt": prompts}), path)
    else:
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    # Parquet splits its first record batch of 1,024 rows; JSONL starts a full batch after it.
    rest = [1024 - FIRST_BATCH_ROWS, 1500 - 1024] if kind == "parquet" else [1024, 1500 - 1088]
    assert batch_sizes(path) == [FIRST_BATCH_ROWS, *rest]
    assert batch_sizes(path, batch_rows=10) == [10] * 150, "never larger than batch_rows"


def test_plain_number_lists_pass_and_everything_else_is_still_checked():
    assert problem([128000] * 1000) is None and problem([1, 2.5, True, None]) is None
    assert problem([1, 2, "a \ud800"]) == "holds '\\ud800' at character 2, which is not valid UTF-8"
    deep = [1, 2]
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert problem(deep) == f"nests deeper than {MAX_DEPTH} levels"
    assert problem({"ids": [1, 2], "k": "\udfff"}) is not None
