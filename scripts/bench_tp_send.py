"""Rank 0's host cost of sending a step to one other tensor-parallel rank (engine/tp_group.py):
encode the packed step and write it into a pipe that another process drains. No GPU needed.

    python scripts/bench_tp_send.py
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import numpy as np

from bulkgen.engine.inputs import PackedStep
from bulkgen.engine.tp_group import FRAME, PIPE_BYTES, encode_step

_DRAIN = "import sys\nwhile sys.stdin.buffer.read(1 << 16):\n    pass"


def measure(tokens: int, seqs: int, steps: int = 2000) -> dict:
    # A step's packed ints: 4 per token, B + 1 + 2 per sequence, 5 per sampled row, appends.
    ints = np.arange(4 * tokens + 8 * seqs + 31, dtype=np.int64)
    floats = np.ones(6 * seqs, np.float32)
    sizes = (tokens, seqs, seqs, 10)
    packed = PackedStep(
        None, None, None, sizes, 0, [1] * seqs, [1] * seqs, [], (ints, floats), from_prev=True
    )
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    reader = subprocess.Popen([sys.executable, "-c", _DRAIN], stdin=read)
    os.close(read)
    times = []
    with os.fdopen(write, "wb") as pipe:
        for _ in range(steps):
            t0 = time.perf_counter()
            payload = encode_step(packed)
            pipe.write(FRAME.pack(len(payload)) + payload)
            pipe.flush()
            times.append(time.perf_counter() - t0)
    reader.wait()
    times.sort()
    return {
        "tokens": tokens,
        "seqs": seqs,
        "bytes": len(payload),
        "median_us": round(1e6 * times[len(times) // 2], 1),
        "p99_us": round(1e6 * times[int(0.99 * len(times))], 1),
    }


if __name__ == "__main__":
    for tokens, seqs in ((256, 256), (2048, 8)):
        print(measure(tokens, seqs))
