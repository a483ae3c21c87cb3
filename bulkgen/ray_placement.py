"""Where --ray puts tensor-parallel workers: each group of N GPUs inside one node.

A worker with --tensor-parallel N is one Ray actor (the group's rank 0, whose Engine starts the
N-1 other ranks as its own processes) that asks for num_gpus=N, so Ray gives it N GPUs of one
node in CUDA_VISIBLE_DEVICES. The groups are reserved together first, through a placement group
of one bundle per worker ({"GPU": N, "CPU": 1}; a bundle never spans nodes) with Ray's PACK
strategy (as few nodes as the bundles fit on): the job starts once every group has its GPUs, or
fails in one line before any work when the cluster cannot hold them.
"""

from __future__ import annotations

from bulkgen.errors import UserError

STRATEGY = "PACK"
RESERVE_WAIT_S = 120.0  # for Ray to reserve the groups the cluster has room for (others' jobs)


def group_bundles(count: int, tp: int, gpus: bool) -> list[dict[str, float]]:
    """The placement group's bundles: one per worker, its N GPUs and one CPU (a CPU only on a
    cluster without GPUs: the ranks' processes are the worker's own, as on one machine)."""
    bundle = {"GPU": float(tp), "CPU": 1.0} if gpus else {"CPU": 1.0}
    return [dict(bundle) for _ in range(count)]


def groups_per_node(nodes: list[dict], tp: int, gpus: bool) -> list[int]:
    """How many groups each live node of ray.nodes() can hold: its GPUs // N, at most its CPUs
    (each group's actor takes one); its CPUs on a cluster without GPUs."""
    held = []
    for node in nodes:
        if not node.get("Alive", True):
            continue
        resources = node.get("Resources", {})
        cpus = int(resources.get("CPU", 0))
        held.append(min(int(resources.get("GPU", 0)) // tp, cpus) if gpus else cpus)
    return held


def check_fit(nodes: list[dict], count: int, tp: int, gpus: bool) -> None:
    """A UserError (one line) if no node has N GPUs, or the nodes cannot hold count groups."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if gpus:
        largest = max((int(r.get("GPU", 0)) for r in alive), default=0)
        if largest < tp:
            raise UserError(
                f"--tensor-parallel {tp}: no Ray node has {tp} GPUs (largest: {largest}); "
                "a group's GPUs must be on one node"
            )
    room = sum(groups_per_node(nodes, tp, gpus))
    if count > room:
        per_node = ", ".join(str(int(r.get("GPU" if gpus else "CPU", 0))) for r in alive)
        plural = "" if room == 1 else "s"
        what = f"group{plural} of {tp} GPUs on one node" if gpus else f"worker{plural} (a CPU each)"
        raise UserError(
            f"--data-parallel {count} --tensor-parallel {tp}: the Ray cluster has room for "
            f"{room} {what} ({'GPUs' if gpus else 'CPUs'} per node: {per_node})"
        )


def reserve(ray, count: int, tp: int, gpus: bool):
    """The placement group of the job's workers, once Ray has reserved all of it; a UserError
    if it could not within RESERVE_WAIT_S (other jobs hold the GPUs)."""
    from ray.util import placement_group, remove_placement_group

    check_fit(ray.nodes(), count, tp, gpus)
    group = placement_group(group_bundles(count, tp, gpus), strategy=STRATEGY)
    ready, _ = ray.wait([group.ready()], timeout=RESERVE_WAIT_S)
    if not ready:
        remove_placement_group(group)
        raise UserError(
            f"--data-parallel {count} --tensor-parallel {tp}: Ray could not reserve the groups "
            f"within {RESERVE_WAIT_S:.0f} s (other jobs hold the cluster's GPUs?)"
        )
    return group


def actor_options(group, index: int, tp: int, gpus: bool) -> dict:
    """Worker index's actor: its bundle of the placement group, and its N GPUs from it."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "num_cpus": 1,
        "num_gpus": tp if gpus else 0,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        ),
    }
