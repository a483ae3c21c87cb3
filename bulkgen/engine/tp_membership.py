"""Membership of a tensor-parallel group's torch.distributed process group: joining it (NCCL on
CUDA, gloo on the CPU, rendezvous through a file), the device a rank takes, and leaving it at the
end of a run. tp_group.py starts and watches the rank processes that join it.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading

import torch

from bulkgen.model.parallel_layers import TensorParallel

_LEAVE_S = 20.0  # for the process group's teardown, after which the process's exit does it
ENV = {"NCCL_NVLS_ENABLE": "0"}  # NVLink multicast stays off on the machines we run on


def timeout_s() -> float:
    """Of a collective, after which it is an error (BULKGEN_TP_TIMEOUT_S, default 10 min: long
    enough for a 70B shard to load while another rank waits in its first collective)."""
    raw = os.environ.get("BULKGEN_TP_TIMEOUT_S", "600")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        from bulkgen.errors import UserError

        raise UserError(f"BULKGEN_TP_TIMEOUT_S must be a positive number of seconds, got {raw!r}")
    return value


def join_group(rank: int, size: int, store: str, device: torch.device) -> TensorParallel:
    """This process's membership of the group (blocks until every rank has joined); store: the
    rendezvous file."""
    os.environ.update(ENV)
    kwargs = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    torch.distributed.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s()),
        **kwargs,
    )
    return TensorParallel(rank, size)


def rank_device(device: torch.device, rank: int, size: int) -> torch.device:
    """Rank r of a group on CUDA takes visible GPU r (a data-parallel worker's group sees its
    own GPUs only, through CUDA_VISIBLE_DEVICES)."""
    if device.type != "cuda" or size == 1:
        return device
    if device.index is not None:
        raise ValueError(
            f"--device {device} picks one GPU; tensor parallelism takes the first "
            f"{size} visible GPUs (choose them with CUDA_VISIBLE_DEVICES)"
        )
    visible = torch.cuda.device_count()
    if visible < size:
        raise ValueError(f"--tensor-parallel {size} needs {size} GPUs; {visible} visible here")
    return torch.device("cuda", rank)


def leave_group(timeout_s: float = _LEAVE_S) -> bool:
    """Leave the process group at the end of a run: every rank calls this at about the same
    time (rank 0 right after sending the stop frame, the others on reading it). NCCL's teardown
    (finalize, and even abort within a node) waits for the peers to tear down too: when rank 0
    waited for the others to exit before leaving, it hung in destroy_process_group on two H200s
    (after every token had been written), and in an abort after that. A teardown that still
    takes over timeout_s is left to run on in a daemon thread (the process's exit ends it), so a
    finished job never hangs there: returns whether the group was left in time."""
    if not torch.distributed.is_initialized():
        return True
    left = threading.Event()

    def leave() -> None:
        try:
            torch.distributed.destroy_process_group()
        finally:
            left.set()

    threading.Thread(target=leave, name="bulkgen-leave-group", daemon=True).start()
    if left.wait(timeout_s):
        return True
    print(
        f"warning: the tensor-parallel group did not close within {timeout_s:.0f} s; "
        "the process's exit closes it",
        file=sys.stderr,
        flush=True,
    )
    return False
