"""--ray --tensor-parallel N: each worker's N GPUs reserved inside one node (ray_placement.py),
and one error line before any work when the cluster cannot hold the groups. The Ray tests start a
local Ray that declares 2 GPUs it does not have: Ray hands them out (CUDA_VISIBLE_DEVICES) all the
same, which is what placement is about; no actor here touches CUDA."""

from __future__ import annotations

import os

import pytest
from test_parallel import write_prompts

from bulkgen.errors import UserError
from bulkgen.parallel import run_parallel
from bulkgen.parallel_ray import actor_env
from bulkgen.ray_placement import STRATEGY, actor_options, check_fit, group_bundles, reserve
from bulkgen.run_config import RunConfig


def node(gpus: int, cpus: int = 8, alive: bool = True) -> dict:
    """One entry of ray.nodes(), as much of it as placement reads."""
    return {"Alive": alive, "Resources": {"CPU": float(cpus), "GPU": float(gpus)}}


def test_each_worker_is_one_bundle_of_its_n_gpus_and_a_cpu_packed_by_ray():
    assert group_bundles(2, 2, gpus=True) == [{"GPU": 2.0, "CPU": 1.0}, {"GPU": 2.0, "CPU": 1.0}]
    assert group_bundles(3, 4, gpus=False) == [{"CPU": 1.0}] * 3  # a cluster without GPUs
    assert STRATEGY == "PACK"


def test_no_node_with_n_gpus_is_one_line_naming_the_largest():
    nodes = [node(2), node(1), node(8, alive=False)]  # a dead node's GPUs do not count
    with pytest.raises(UserError) as e:
        check_fit(nodes, 1, 4, gpus=True)
    assert str(e.value).startswith("--tensor-parallel 4: no Ray node has 4 GPUs (largest: 2)")
    assert "\n" not in str(e.value)


def test_groups_are_counted_per_node_not_over_the_cluster():
    nodes = [node(3), node(3)]  # 6 GPUs, but a group of 2 cannot span two nodes' odd ones
    check_fit(nodes, 2, 2, gpus=True)
    room = r"room for 2 groups of 2 GPUs on one node \(GPUs per node: 3, 3\)"
    with pytest.raises(UserError, match=room):
        check_fit(nodes, 3, 2, gpus=True)
    with pytest.raises(UserError, match="room for 1 group of 2 GPUs"):  # each actor takes a CPU
        check_fit([node(4, cpus=1)], 2, 2, gpus=True)


@pytest.fixture(scope="module")
def two_gpu_ray():
    """A local Ray with one node that declares 2 GPUs (and 2 CPUs)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_a_worker_actor_gets_n_gpus_of_its_bundle_and_nvls_off(two_gpu_ray):
    ray = two_gpu_ray

    @ray.remote
    def seen() -> tuple[str, str]:
        return os.environ["CUDA_VISIBLE_DEVICES"], os.environ.get("NCCL_NVLS_ENABLE", "")

    group = reserve(ray, 1, 2, gpus=True)
    try:
        assert group.bundle_specs == [{"GPU": 2.0, "CPU": 1.0}]
        options = actor_options(group, 0, 2, gpus=True)
        assert options["num_gpus"] == 2 and options["num_cpus"] == 1
        task = seen.options(**options, runtime_env={"env_vars": actor_env()})
        devices, nvls = ray.get(task.remote(), timeout=60)
        assert sorted(devices.split(",")) == ["0", "1"]
        assert nvls == "0"
    finally:
        ray.util.remove_placement_group(group)


@pytest.mark.parametrize(
    ("workers", "tp", "error"),
    [
        (1, 4, "--tensor-parallel 4: no Ray node has 4 GPUs (largest: 2)"),
        (None, 4, "--tensor-parallel 4: no Ray node has 4 GPUs (largest: 2)"),
        (2, 2, "--data-parallel 2 --tensor-parallel 2: the Ray cluster has room for 1 group"),
    ],
)
def test_a_job_the_cluster_cannot_place_fails_in_one_line_before_any_work(
    tmp_path, tiny_model_dir, two_gpu_ray, workers, tp, error
):
    prompts = write_prompts(tmp_path / "in.jsonl", 4)
    out = tmp_path / "out"
    config = RunConfig(inputs=(str(prompts),), out=str(out), model=str(tiny_model_dir),
                       quiet=True, tensor_parallel=tp)  # fmt: skip
    with pytest.raises(UserError) as e:
        run_parallel(config, workers, "")
    assert str(e.value).startswith(error) and "\n" not in str(e.value)
    assert not (out / "job.json").exists() and not list(out.glob("part-*"))


def test_gpus_another_job_holds_are_waited_for_then_one_error_line(two_gpu_ray, monkeypatch):
    ray = two_gpu_ray
    monkeypatch.setattr("bulkgen.ray_placement.RESERVE_WAIT_S", 1.0)
    other = ray.util.placement_group([{"GPU": 2.0}])  # another job's, holding both GPUs
    ray.get(other.ready(), timeout=60)
    try:
        with pytest.raises(UserError, match="Ray could not reserve the groups within 1 s"):
            reserve(ray, 1, 2, gpus=True)
        pending = [g for g in ray.util.placement_group_table().values() if g["state"] == "PENDING"]
        assert not pending, "the job's unplaced group is given back"
    finally:
        ray.util.remove_placement_group(other)


@pytest.mark.gpu
def test_a_ray_worker_of_two_ranks_runs_on_two_real_gpus(tmp_path, tiny_model_dir, two_gpu_ray):
    """On nvidia-h200-x2 the local Ray's 2 GPUs are real: one actor of num_gpus=2, its engine
    rank 0 on one and its rank 1 process on the other, joined by NCCL."""
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    prompts = write_prompts(tmp_path / "in.jsonl", 8)
    config = RunConfig(inputs=(str(prompts),), out=str(tmp_path / "out"),
                       model=str(tiny_model_dir), quiet=True, tensor_parallel=2)  # fmt: skip
    stats = run_parallel(config, 1, "")
    assert stats["rows"] == 8 and stats["data_parallel"]["gpus"] == 2
    assert [w["tensor_parallel"] for w in stats["workers"]] == [2]
    assert stats["workers"][0]["device"].startswith("cuda")
