"""job.json records `job_seed` only when a row may sample without --seed, or once added inputs
may."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from test_pipeline import make_config, output

from bulkgen.config import SamplingParams
from bulkgen.io.inputs import find_sources
from bulkgen.io.reader import Reader
from bulkgen.pipeline import run
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


def test_inputs_added_later_whose_rows_may_sample_get_a_job_seed_then(tmp_path, tiny_model_dir):
    """The first inputs were greedy Parquet (no job_seed); an added JSONL file's sampled rows
    come back the same when a lost shard is generated again."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    pq.write_table(pa.table({"id": ["a0"], "prompt": ["Say hi."]}), folder / "a.parquet")
    config = make_config(tmp_path, tiny_model_dir, [folder], device="cpu", shard_size=1)
    run(config)
    assert "job_seed" not in json.loads((out / "job.json").read_text())
    lines = [{"id": f"b{i}", "prompt": "Rain", "temperature": 1.0} for i in range(3)]
    (folder / "b.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run(config)
    assert "job_seed" in json.loads((out / "job.json").read_text())
    first = {r["id"]: r["text"] for r in output(out)}
    for shard in out.glob("part-*.parquet"):
        if pq.read_table(shard)["id"].to_pylist() == ["b2"]:
            shard.unlink()
    run(config)
    assert {r["id"]: r["text"] for r in output(out)} == first
