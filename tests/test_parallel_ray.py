"""--ray: the workers as Ray actors on a local Ray (2 CPUs), handed rows by the driver as they
have room (work_sharing.py), each row written exactly once."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading

import pytest
from test_parallel import rows_done, shard_rows, wait_until, write_prompts

from bulkgen.config import SamplingParams
from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.errors import UserError
from bulkgen.parallel import run_parallel
from bulkgen.parallel_ray import actor_name
from bulkgen.run_config import RunConfig


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for this module's Ray tests: starting it takes seconds."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_a_ray_actor_that_cannot_load_the_model_fails_the_job_and_leaves_no_settings(
    tmp_path, tiny_model_dir, local_ray
):
    """The model folder passes the driver's checks but no actor can load it: the job fails with
    the actor's message, and a rerun with another --model is not refused as a changed job."""
    bad = tmp_path / "bad-model"
    shutil.copytree(tiny_model_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    prompts = write_prompts(tmp_path / "in.jsonl", 6)
    out = tmp_path / "out"
    greedy = SamplingParams(max_tokens=2, temperature=0.0)
    config = RunConfig(inputs=(str(prompts),), out=str(out), model=str(bad), quiet=True,
                       device="cpu", sampling=greedy)  # fmt: skip
    with pytest.raises(UserError, match="GPT2LMHeadModel"):
        run_parallel(config, 2, "")
    assert not (out / "job.json").exists() and not list(out.glob("part-*"))
    good = dataclasses.replace(config, model=str(tiny_model_dir))
    stats = run_parallel(good, 2, "")
    assert stats["rows"] == 6
    # The driver handed each row out once (an actor that loads first may take them all: the
    # actors do not wait for each other).
    assert sum(w["rows_handed"] for w in stats["workers"]) == 6
    assert stats["data_parallel"]["end_gap_s"] is not None


def test_a_ray_actor_killed_mid_way_is_restarted_and_every_row_is_written_once(
    tmp_path, tiny_model_dir, monkeypatch, local_ray
):
    ray = local_ray
    rows = 2000
    prompts = write_prompts(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 2, "step_delay": 0.04}))
    config = RunConfig(inputs=(str(prompts),), out=str(out), model=str(tiny_model_dir),
                       shard_size=50, max_num_seqs=16, quiet=True)  # fmt: skip
    result: dict = {}

    def driver() -> None:
        try:
            result["stats"] = run_parallel(config, 2, "")
        except BaseException as e:
            result["error"] = e

    thread = threading.Thread(target=driver)
    thread.start()
    wait_until(lambda: out.is_dir() and rows_done(out, "part-w01-*") > 0, timeout=120)
    assert 0 < rows_done(out) < rows
    ray.kill(ray.get_actor(actor_name(str(out), 1)), no_restart=False)
    thread.join(timeout=120)
    assert "error" not in result, result.get("error")
    ids = [r["id"] for r in shard_rows(out)]
    assert len(ids) == len(set(ids)) == rows
    assert not list(out.glob(".part-*")), "the killed attempt's temporary shard is gone"
    stats = result["stats"]
    assert stats["rows"] == stats["this_run"]["rows"] == rows
    # The restarted actor resumed after the shards its killed attempt had completed.
    assert stats["workers"][1]["this_run"]["resumed_after_rows"] > 0
    # The rows the killed attempt held unwritten were handed out again (work_sharing.py).
    assert sum(w["rows_handed"] for w in stats["workers"]) > rows


def test_two_ray_workers_of_two_tensor_parallel_ranks_write_every_row_once(
    tmp_path, tiny_model_dir, local_ray
):
    """On the CPU each actor (one CPU of its placement-group bundle) is rank 0 of its group and
    starts rank 1 as its own process, joined by gloo: the texts are those of one process."""
    prompts = write_prompts(tmp_path / "in.jsonl", 12)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    config = RunConfig(inputs=(str(prompts),), out=str(tmp_path / "out"),
                       model=str(tiny_model_dir), quiet=True, device="cpu", sampling=greedy,
                       shard_size=4, tensor_parallel=2)  # fmt: skip
    stats = run_parallel(config, 2, "")
    assert stats["data_parallel"]["tensor_parallel"] == 2
    rows = shard_rows(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == sorted(f"in:{i}" for i in range(12))
    assert [w["tensor_parallel"] for w in stats["workers"]] == [2, 2]  # each engine a group
    # The job's placement group (a bundle of one CPU per worker) is given back at its end.
    groups = local_ray.util.placement_group_table().values()
    assert groups and all(g["state"] == "REMOVED" for g in groups)
    single = dataclasses.replace(config, out=str(tmp_path / "single"), tensor_parallel=1)
    run_parallel(single, 1, None)  # one process on this machine
    texts = {r["id"]: r["text"] for r in shard_rows(tmp_path / "single")}
    assert all(r["text"] == texts[r["id"]] for r in rows)
