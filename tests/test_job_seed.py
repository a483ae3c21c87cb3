"""job.json records `job_seed` only when a row may sample without --seed."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.config import SamplingParams
from bulkgen.io.inputs import find_sources
from bulkgen.io.reader import Reader
from bulkgen.preflight import job_record
from bulkgen.run_config import RunConfig


def record(tmp_path, path, **sampling) -> dict:
    config = RunConfig(inputs=(str(path),), out=str(tmp_path / "out"), model="m",
                       sampling=SamplingParams(**sampling))  # fmt: skip
    reader = Reader(find_sources(config.inputs), "prompt", "id", ())
    return job_record(config, tmp_path, reader)


def test_job_seed_is_recorded_only_when_it_can_be_used(tmp_path):
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"prompt": ["a"]}), plain)
    with_temperature = tmp_path / "t.parquet"
    pq.write_table(pa.table({"prompt": ["a"], "temperature": [0.7]}), with_temperature)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "a"}) + "\n")

    assert "job_seed" not in record(tmp_path, plain, temperature=0.0)  # greedy: unused
    assert "job_seed" not in record(tmp_path, plain, temperature=0.8, seed=3)  # --seed given
    assert "job_seed" in record(tmp_path, plain, temperature=0.8)
    assert "job_seed" in record(tmp_path, with_temperature, temperature=0.0)  # rows may sample
    assert "job_seed" in record(tmp_path, rows, temperature=0.0)  # so may any JSONL row
