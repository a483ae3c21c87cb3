"""--output-token-ids keeps each completion's generated ids, in every output format."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV

TOKENS = [11, 12, 13]


@pytest.fixture
def job(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1, "tokens": TOKENS}))
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n" + '{"id": "b"}\n')  # b: error
    return lambda *extra: CliRunner().invoke(
        main, ["run", str(inp), "-m", str(tiny_model_dir), "-o", str(tmp_path / "out"), *extra]
    )


def test_parquet_has_a_list_column_of_token_ids(job, tmp_path):
    assert job("--output-token-ids").exit_code == 0
    table = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    kind = table.schema.field("token_ids").type
    assert kind.num_fields == 1 and kind.value_type == pa.int64()  # list<int64>
    rows = {r["id"]: r for r in table.to_pylist()}
    assert rows["a"]["token_ids"] == TOKENS and rows["a"]["completion_tokens"] == len(TOKENS)
    assert rows["b"]["token_ids"] is None  # an error record generated nothing


def test_jsonl_and_openai_lines_carry_them(job, tmp_path):
    assert job("--output-token-ids", "--format", "jsonl").exit_code == 0
    lines = (tmp_path / "out" / "part-00000.jsonl").read_text().splitlines()
    assert {json.loads(x)["id"]: json.loads(x)["token_ids"] for x in lines}["a"] == TOKENS


def test_openai_choices_carry_them(job, tmp_path):
    assert job("--output-token-ids", "--format", "openai", "--n", "2").exit_code == 0
    text = (tmp_path / "out" / "part-00000.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines()]
    line = next(x for x in lines if x["custom_id"] == "a")
    assert [c["token_ids"] for c in line["response"]["body"]["choices"]] == [TOKENS, TOKENS]


def test_without_the_flag_there_is_no_column(job, tmp_path):
    assert job().exit_code == 0
    assert "token_ids" not in pq.read_schema(tmp_path / "out" / "part-00000.parquet").names
