"""--data-parallel N: N workers take the rows the parent hands them, each row once (--ray, the
same with Ray actors: test_parallel_ray.py; the credit and hand-out rules: test_work_sharing.py).

Without GPUs the workers run on the CPU, which is how these tests run them. The runs that must
last long enough to be killed use the FakeEngine (BULKGEN_FAKE_ENGINE, a switch for tests) with a
delay per step; the tokenizer, reader, writer and job folder are the real ones.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV

REPO = Path(__file__).resolve().parent.parent


def write_prompts(path: Path, count: int) -> Path:
    path.write_text(
        "".join(json.dumps({"prompt": f"Question number {i}?"}) + "\n" for i in range(count))
    )
    return path


def shard_rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def rows_done(out: Path, pattern: str = "part-*.parquet") -> int:
    return sum(pq.read_metadata(p).num_rows for p in out.glob(pattern))


def wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def one_and_two(tmp_path, common: list, *two_flags: str) -> tuple[dict, list[dict]]:
    """The rows of one run (by id) and of the same run with two_flags, into one/ and two/."""
    runner = CliRunner()
    one = runner.invoke(main, ["run", *map(str, common), "-o", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    two = runner.invoke(main, ["run", *map(str, common), "-o", str(tmp_path / "two"), *two_flags])
    assert two.exit_code == 0, two.output
    return {r["id"]: r for r in shard_rows(tmp_path / "one")}, shard_rows(tmp_path / "two")


def test_two_workers_give_the_greedy_outputs_of_one(tmp_path, tiny_model_dir):
    prompts = write_prompts(tmp_path / "in.jsonl", 12)
    common = [prompts, "-m", tiny_model_dir, "--max-tokens", "8", "--device", "cpu", "-q",
              "--shard-size", "4"]  # fmt: skip
    single, rows = one_and_two(tmp_path, common, "--data-parallel", "2")
    assert sorted(r["id"] for r in rows) == sorted(single) == sorted(f"in:{i}" for i in range(12))
    for row in rows:
        assert row["text"] == single[row["id"]]["text"]
        assert row["completion_tokens"] == single[row["id"]]["completion_tokens"]
    # Each worker wrote the rows it was handed into shards of its own.
    by_worker = [[r["id"] for p in (tmp_path / "two").glob(f"part-w0{k}-*.parquet")
                  for r in pq.read_table(p).to_pylist()] for k in (0, 1)]  # fmt: skip
    assert all(by_worker) and not set(by_worker[0]) & set(by_worker[1])
    stats = json.loads((tmp_path / "two" / "stats.json").read_text())
    assert stats["rows"] == 12 and stats["this_run"]["rows"] == 12
    assert [w["worker"] for w in stats["workers"]] == [0, 1]
    assert sum(w["this_run"]["rows"] for w in stats["workers"]) == 12


def test_worker_i_sees_only_the_ith_gpu_from_its_start(tmp_path, tiny_model_dir, monkeypatch):
    """GPU ids are faked (the FakeEngine touches no device): what matters is each worker's
    CUDA_VISIBLE_DEVICES, which it has from its first instruction."""
    import bulkgen.parallel_local

    monkeypatch.setattr(bulkgen.parallel_local, "_visible_gpus", lambda config: ["3", "5"])
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1}))
    prompts = write_prompts(tmp_path / "in.jsonl", 20)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    args = [prompts, "-m", tiny_model_dir, "-o", tmp_path / "out", "--gpus", "all", "-q"]
    result = CliRunner().invoke(main, ["run", *map(str, args)])
    assert result.exit_code == 0, result.output
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert [w["cuda_visible_devices"] for w in stats["workers"]] == ["3", "5"]
    assert {k: stats["data_parallel"][k] for k in ("workers", "backend", "gpus")} == {
        "workers": 2,
        "backend": "processes",
        "gpus": ["3", "5"],
    }
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before, "the parent's own is unchanged"


def run_with_fake_workers(tmp_path, tiny_model_dir, monkeypatch, prompts, fakes: list[dict]):
    """--data-parallel len(fakes) on the CPU, worker i's engine a FakeEngine(**fakes[i]) (set in
    its environment as it is spawned); the stats.json of the job."""
    import bulkgen.parallel_local

    env_of = bulkgen.parallel_local._worker_env
    spawned = iter(fakes)
    monkeypatch.setattr(
        bulkgen.parallel_local,
        "_worker_env",
        lambda gpus, count: {**env_of(gpus, count), FAKE_ENGINE_ENV: json.dumps(next(spawned))},
    )
    out = tmp_path / "out"
    args = [prompts, "-m", tiny_model_dir, "-o", out, "-q", "--device", "cpu", "--max-tokens", 30,
            "--max-num-seqs", 8, "--shard-size", 25, "--data-parallel", len(fakes)]  # fmt: skip
    result = CliRunner().invoke(main, ["run", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "stats.json").read_text())


def test_rows_of_uneven_lengths_are_each_written_once_and_the_workers_end_together(
    tmp_path, tiny_model_dir, monkeypatch
):
    """Rows take from 1 to 30 engine steps each (their prompts' lengths): the workers take
    more rows as they write theirs, and neither is left running alone for long."""
    count = 300
    words = [" ".join(["fox"] * (1 + (i * 7) % 29)) for i in range(count)]
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
    fake = {"step_per_token": True, "step_delay": 0.01}
    stats = run_with_fake_workers(tmp_path, tiny_model_dir, monkeypatch, prompts, [fake, fake])
    ids = [r["id"] for r in shard_rows(tmp_path / "out")]
    assert sorted(ids) == sorted(f"in:{i}" for i in range(count))
    handed = [w["rows_handed"] for w in stats["workers"]]
    assert sum(handed) == count and all(h > count // 4 for h in handed)
    assert [w["this_run"]["rows"] for w in stats["workers"]] == handed
    assert stats["data_parallel"]["end_gap_s"] < 1.5, stats["workers"]


def test_a_fast_worker_takes_more_rows_and_the_slow_one_ends_with_it(
    tmp_path, tiny_model_dir, monkeypatch
):
    """Worker 0's engine steps take 5 times as long as worker 1's. A split fixed before the run
    would leave worker 0 running alone for about 80% of its time; shared on demand, the fast
    worker writes most rows and the two end within the time of the slow worker's last rows."""
    prompts = write_prompts(tmp_path / "in.jsonl", 600)
    slow, fast = {"steps": 2, "step_delay": 0.1}, {"steps": 2, "step_delay": 0.02}
    stats = run_with_fake_workers(tmp_path, tiny_model_dir, monkeypatch, prompts, [slow, fast])
    ids = [r["id"] for r in shard_rows(tmp_path / "out")]
    assert len(ids) == len(set(ids)) == 600
    handed = [w["rows_handed"] for w in stats["workers"]]
    assert sum(handed) == 600 and handed[1] > 2 * handed[0], handed
    assert stats["data_parallel"]["end_gap_s"] < 1.5, stats["workers"]


def test_workers_write_every_sample_of_the_first_limit_rows_once(tmp_path, tiny_model_dir):
    """The parent reads the input once: --limit and --n hold for the job as a whole."""
    prompts = write_prompts(tmp_path / "in.jsonl", 100)
    out = tmp_path / "out"
    args = [prompts, "-m", tiny_model_dir, "-o", out, "-q", "--device", "cpu", "--n", 3, "--limit",
            40, "--max-num-seqs", 8, "--shard-size", 7, "--data-parallel", 2]  # fmt: skip
    env = {FAKE_ENGINE_ENV: json.dumps({"steps": 2, "step_delay": 0.005})}
    result = CliRunner(env=env).invoke(main, ["run", *map(str, args)])
    assert result.exit_code == 0, result.output
    keys = [(r["id"], r["sample"]) for r in shard_rows(out)]
    assert sorted(keys) == sorted((f"in:{i}", k) for i in range(40) for k in range(3))
    stats = json.loads((out / "stats.json").read_text())
    assert [w["rows_handed"] > 0 for w in stats["workers"]] == [True, True]
    assert sum(w["rows_handed"] for w in stats["workers"]) == 40


def test_a_damaged_input_fails_a_data_parallel_job_in_one_line_after_the_rows_before_it(
    tmp_path, tiny_model_dir
):
    import gzip

    data = gzip.compress(b"".join(b'{"prompt": "p %d"}\n' % i for i in range(20000)))
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    args = [path, "-m", tiny_model_dir, "-o", out, "-q", "--device", "cpu", "--shard-size", 2000,
            "--data-parallel", 2]  # fmt: skip
    env = {FAKE_ENGINE_ENV: json.dumps({"steps": 1})}
    result = CliRunner(env=env).invoke(main, ["run", *map(str, args)])
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "\n" not in line and " from row " in line and "in.jsonl.gz" in line, line
    first_lost = int(line.split(" from row ")[1].split()[0])
    ids = [r["id"] for r in shard_rows(out)]
    assert 0 < first_lost < 20000 and sorted(ids) == sorted(f"in:{i}" for i in range(first_lost))


def test_gpus_all_without_a_gpu_asks_for_a_number(tmp_path, tiny_model_dir):
    prompts = write_prompts(tmp_path / "in.jsonl", 2)
    args = [
        prompts,
        "-m",
        tiny_model_dir,
        "-o",
        tmp_path / "out",
        "--gpus",
        "all",
        "--device",
        "cpu",
    ]
    result = CliRunner().invoke(main, ["run", *map(str, args)])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: --gpus all: this machine has no GPU; pass the number of workers, e.g. "
        "--data-parallel 2"
    ]
    bad = CliRunner().invoke(main, ["run", str(prompts), "-o", "x", "--data-parallel", "two"])
    assert bad.exit_code == 2 and "number of workers or 'all'" in bad.output


@pytest.mark.gpu
def test_two_gpu_workers_give_the_greedy_outputs_of_one_gpu(tmp_path, tiny_model_dir):
    """On a machine with two GPUs: --gpus all puts one worker on each, with the outputs of one
    engine on one GPU (float32, so that the two runs' batches cannot round differently)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    prompts = write_prompts(tmp_path / "in.jsonl", 24)
    common = [prompts, "-m", tiny_model_dir, "--max-tokens", "16", "--device", "cuda", "-q",
              "--dtype", "float32", "--shard-size", "5"]  # fmt: skip
    single, rows = one_and_two(tmp_path, common, "--gpus", "all")
    assert sorted(r["id"] for r in rows) == sorted(single)
    assert all(r["text"] == single[r["id"]]["text"] for r in rows)
    stats = json.loads((tmp_path / "two" / "stats.json").read_text())
    workers = stats["workers"]
    assert [w["cuda_visible_devices"] for w in workers] == stats["data_parallel"]["gpus"]
    assert all("gpu_busy_pct" in w for w in workers), "each worker's own GPU, found through NVML"
    assert len(workers) == torch.cuda.device_count() and all(
        w["device"].startswith("cuda") for w in workers
    )
    assert stats["data_parallel"]["end_gap_s"] < 5, [w["end_s"] for w in workers]
