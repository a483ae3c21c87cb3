"""A tensor-parallel rank other than 0: `python -m bulkgen.engine.tp_worker SPEC PID` (tp_group.py
starts it; PID is rank 0's, its parent's). It builds the same Engine as rank 0 on its own shard, so
that loading, the KV-cache probe, the warm-up and the CUDA-graph capture run the same collectives
in the same order on every rank, then replays rank 0's steps from its stdin until the stop frame
(length 0) or EOF. It ends at once when rank 0's process goes away.

It does no host work beyond unpacking a step and enqueueing its kernels: no scheduler, sampler
or text. Its error, if any, is the last line of its stderr (a log file rank 0 reads).
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

if TYPE_CHECKING:
    from bulkgen.engine.tp_group import RankSpec


def follow(runner, inp: BinaryIO) -> None:
    """Replay rank 0's steps: forward with the same collectives, then take its sampled ids."""
    from bulkgen.engine.tp_group import FRAME  # imports torch: only once the parent is watched

    while True:
        header = inp.read(FRAME.size)
        if len(header) < FRAME.size:
            return  # rank 0 is gone
        (length,) = FRAME.unpack(header)
        if length == 0:
            return  # the stop frame
        body, ints, floats = pickle.loads(inp.read(length))
        sizes, query_lens, seq_lens, from_prev = body
        packed = runner.packer.load(
            np.frombuffer(ints, np.int64),
            np.frombuffer(floats, np.float32),
            sizes,
            query_lens,
            seq_lens,
            from_prev,
            runner.copy_stream,
        )
        runner.sample(runner.forward_packed(packed, None))


def _watch_parent(parent: int, folder: Path) -> None:
    """End at once if rank 0's process (parent, the pid it passed) is gone or goes away (it may
    have been killed with -9). Not os.getppid() taken here: had rank 0 died while this process
    started, it would be init's child already, and watch init (found by fuzzing). The group's
    folder (rank specs, logs, rendezvous) goes too: rank 0 removes it when it ends, -9 cannot."""

    def leave() -> None:
        if folder.name.startswith("bulkgen-tp-"):
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    if os.getppid() != parent:
        leave()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        leave()

    threading.Thread(target=watch, name="bulkgen-tp-parent", daemon=True).start()


def main(spec_path: str, parent: int) -> int:
    _watch_parent(parent, Path(spec_path).parent)  # first: torch's import takes seconds
    with open(spec_path, "rb") as f:
        spec: RankSpec = pickle.load(f)
    try:
        from bulkgen.engine.engine import Engine
        from bulkgen.engine.model_files import resolve_device

        if resolve_device(spec.config.device).type == "cpu":
            from bulkgen.cpu import use_cpu_threads

            use_cpu_threads(spec.config.tensor_parallel)  # the group shares the cores
        engine = Engine(spec.config, spec.model_config, rank=spec)
        follow(engine.runner, sys.stdin.buffer)
        engine.close()
    except BaseException as e:  # noqa: BLE001 - reported to rank 0 as the log's last line
        traceback.print_exc()
        print(f"error: {type(e).__name__}: {e}".replace("\n", " "), file=sys.stderr, flush=True)
        # A collective fails when rank 0 dies (a data-parallel worker ended by SIGTERM, say):
        # then nobody else removes the group's folder. Rank 0 alive reads the log and removes it.
        for _ in range(20):
            if os.getppid() != parent:
                if Path(spec_path).parent.name.startswith("bulkgen-tp-"):
                    shutil.rmtree(Path(spec_path).parent, ignore_errors=True)
                break
            time.sleep(0.1)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
