"""--n: K samples per row, each with its own reproducible seed; resume counts (id, sample) pairs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from test_pipeline import RecordingEngine, factory, make_config, output, write_jsonl

from bulkgen.config import SamplingParams
from bulkgen.pipeline import run
from bulkgen.row import Row
from bulkgen.samples import Samples

SAMPLING = SamplingParams(max_tokens=8, temperature=1.0)
SEEDED = SamplingParams(max_tokens=8, temperature=1.0, seed=5)


def by_pair(rows):
    return {(r["id"], r["sample"]): r for r in rows}


def test_each_row_gets_n_samples_with_its_id_and_an_index(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": "Hello"} for i in "ab"])
    config = make_config(tmp_path, tiny_model_dir, [path], n=3, sampling=SAMPLING, format="jsonl")
    stats = run(config, factory())
    rows = output(tmp_path / "out")
    assert sorted((r["id"], r["sample"]) for r in rows) == [(i, k) for i in "ab" for k in range(3)]
    seeds = [p.seed for _, p in RecordingEngine.instances[0].added.values()]
    assert len(set(seeds)) == 6, "every sample has a seed of its own"
    assert stats["rows"] == 6


def test_sample_zero_keeps_the_seed_of_a_job_without_n():
    params = SamplingParams(temperature=0.7, seed=11)
    one = Samples(params, n=1)([Row("x", "p")])
    three = Samples(params, n=3)([Row("x", "p")])
    assert [r.sample for r in three] == [0, 1, 2]
    assert three[0].params.seed == one[0].params.seed
    assert len({r.params.seed for r in three}) == 3


def test_ids_holding_a_colon_never_share_a_seed_with_another_rows_sample():
    """(seed, 'q', sample 1) and (seed, 'q:1', sample 0) joined by ':' read alike; a row id '3'
    under --seed 5 and sample 3 of a row whose own seed column is 5 too."""
    params = SamplingParams(temperature=1.0, seed=5)
    rows = Samples(params, n=2)([Row("q", "p"), Row("q:1", "p"), Row("3", "p")])
    rows += Samples(SamplingParams(temperature=1.0), n=4)([Row("own", "p", overrides={"seed": 5})])
    seeds = [r.params.seed for r in rows]
    assert len(set(seeds)) == len(seeds) == 10
    assert rows[-4].params.seed == 5  # a row's own seed is its sample 0's as it is


def test_a_row_asking_more_logprobs_than_the_vocabulary_is_its_error_record():
    samples = Samples(SamplingParams(max_tokens=4), vocab_size=100)
    rows = samples(
        [Row("ok", "p", overrides={"logprobs": 100}), Row("big", "p", overrides={"logprobs": 101})]
    )
    assert rows[0].error is None and rows[0].params.logprobs == 100
    assert rows[1].error == (
        "bad sampling parameter: logprobs 101 is more than the model's vocabulary (100 tokens)"
    )


def test_greedy_samples_take_no_seed():
    rows = Samples(SamplingParams(temperature=0.0), n=2, job_seed=5)([Row("x", "p")])
    assert [r.params.seed for r in rows] == [None, None]


def test_a_rerun_without_seed_samples_the_same_text(tmp_path, tiny_model_dir):
    """No --seed and temperature > 0: the job's recorded seed makes samples reproducible."""
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": f"Hi {i}"} for i in "abc"])
    config = make_config(tmp_path, tiny_model_dir, [path], n=3, sampling=SAMPLING, device="cpu")
    run(config)
    first = by_pair(output(tmp_path / "out"))
    assert len({r["text"] for r in first.values()}) > 1, "the samples differ"
    # Lose some shards' worth of samples: keep a's sample 0, b's samples 0 and 2, all of c.
    keep = {("a", 0), ("b", 0), ("b", 2), ("c", 0), ("c", 1), ("c", 2)}
    for shard in (tmp_path / "out").glob("part-*.parquet"):
        table = pq.read_table(shard).to_pylist()
        kept = [r for r in table if (r["id"], r["sample"]) in keep]
        pq.write_table(pa.Table.from_pylist(kept, pq.read_schema(shard)), shard)
    stats = run(config)
    again = output(tmp_path / "out")
    assert sorted((r["id"], r["sample"]) for r in again) == sorted(first)
    assert stats["this_run"]["rows"] == 3  # a:1, a:2 and b:1, nothing else
    assert {k: r["text"] for k, r in by_pair(again).items()} == {
        k: r["text"] for k, r in first.items()
    }


def test_resume_generates_only_the_pairs_of_a_lost_shard(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": "p"} for i in range(50)])
    config = make_config(tmp_path, tiny_model_dir, [path], n=2, shard_size=7, format="jsonl")
    run(config, factory())
    lost_shard = sorted((tmp_path / "out").glob("part-*.jsonl"))[-2]
    lost = {(r["id"], r["sample"]) for r in map(json.loads, lost_shard.read_text().splitlines())}
    lost_shard.unlink()
    stats = run(config, factory())
    pairs = [(r["id"], r["sample"]) for r in output(tmp_path / "out")]
    assert len(pairs) == len(set(pairs)) == 100
    newest = sorted((tmp_path / "out").glob("part-*.jsonl"))[-1]  # the rerun's one shard
    regenerated = {(r["id"], r["sample"]) for r in map(json.loads, newest.read_text().splitlines())}
    assert regenerated == lost and stats["this_run"]["rows"] == len(lost) == 7
    assert len(RecordingEngine.instances[0].added) == 7


def test_samples_share_their_prompt_through_the_prefix_cache(tmp_path, tiny_model_dir):
    prompt = "Summarise the following text in one sentence, then list three keywords. " * 3
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": prompt + i} for i in "abc"])
    texts, cached = {}, {}
    for on in (True, False):
        config = make_config(tmp_path, tiny_model_dir, [path], n=3, device="cpu", overwrite=True,
                             sampling=SEEDED, prefix_cache=on, max_num_seqs=2)  # fmt: skip
        run(config)
        texts[on] = {(r["id"], r["sample"]): r["text"] for r in output(tmp_path / "out")}
        cached[on] = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert texts[True] == texts[False]
    assert cached[True]["cached_prompt_tokens"] > 0 and cached[False]["cached_prompt_tokens"] == 0


def test_run_help_lists_the_generation_flags():
    from test_cli import bulkgen

    help_text = bulkgen("run", "--help").output
    for flag in ["--n ", "--messages-column", "--system", "--chat", "--stop ", "--stop-token-id",
                 "--logprobs", "--no-prefix-cache", "openai"]:  # fmt: skip
        assert flag in help_text
