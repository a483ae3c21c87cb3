"""The scaling-out options of `bulkgen run` (data and tensor parallelism, Ray): run_options.py
lists them last, in this order; parallel.py and the engine read their values."""

from __future__ import annotations

import click

SCALING_OPTIONS = [
    click.option(
        "--data-parallel",
        "--gpus",
        "data_parallel",
        metavar="N|all",
        default=None,
        help="Run N engine workers, one per GPU (all: every GPU; without GPUs, N CPU workers). "
        "The input is read once and rows are handed to each worker as it has room; each worker "
        "writes its own part-wII-* shards, and a rerun resumes with any N.",
    ),
    click.option(
        "--tensor-parallel",
        "--tp",
        "tensor_parallel",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        metavar="N",
        help="Split the model over N GPUs (one process each, joined by NCCL; on the CPU, N "
        "processes joined by gloo), for models larger than one GPU. With --data-parallel M, "
        "M groups of N GPUs.",
    ),
    click.option(
        "--ray",
        "ray_address",
        metavar="[ADDRESS]",
        is_flag=False,
        flag_value="",
        default=None,
        help="Run the workers as Ray actors (pip install 'bulkgen[ray]') on the cluster at ADDRESS "
        "(auto, ray://HOST:10001); with no ADDRESS, RAY_ADDRESS's cluster or a local Ray. --out "
        "must be a folder every node shares.",
    ),
]
