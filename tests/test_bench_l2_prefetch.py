"""scripts/bench_l2_prefetch.py (an experiment run on the GPU machine): the prefetch launch asks
for the first K tiles of exactly the weight rows and K ranges the GEMM's programs start on, and
the kernel compiles for sm_90 to L2 prefetches."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

# Before triton is imported (bench_l2_prefetch imports it): run alone or first, this file would
# otherwise leave later files' kernels without a driver on a machine without CUDA.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_l2_prefetch import prefetch_plan  # noqa: E402

from bulkgen.model.fp8_gemm_configs import CANDIDATES  # noqa: E402


def test_the_plan_covers_each_programs_first_tiles():
    config = CANDIDATES["m16n64k256s2tfp3"]  # qkv's launch at 32 rows
    plan = prefetch_plan(6144, 4096, config, tiles=2)
    # 96 tiles of 64 rows, 2 K splits of 8 tiles of 256 bytes: 2 lines a tile
    assert plan["grid"] == (96, 2) and plan["per_split"] == 8 and plan["lines"] == 2
    assert plan["bytes"] == 6144 * 2 * 2 * 256
    # never more tiles than a split has; a 128-byte tile is one line
    small = prefetch_plan(4096, 256, CANDIDATES["m16n64k128s4tf"], tiles=4)
    assert small["per_split"] == 1 and small["tiles"] == 1 and small["lines"] == 1
    assert prefetch_plan(4096, 4096, config, tiles=0)["bytes"] == 0


def test_it_compiles_for_sm_90_to_l2_prefetches():
    """Compiled in a process without TRITON_INTERPRET (the interpreter skips the GPU compiler;
    other tests of a worker set it): L2 prefetches only, nothing loaded into registers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    script = ROOT / "scripts" / "bench_l2_prefetch.py"
    done = subprocess.run(
        [sys.executable, str(script), "--compile-check"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    prefetches, loads = map(
        int, re.findall(r"(\d+) L2 prefetches, (\d+) global loads", done.stdout)[0]
    )
    assert prefetches >= 2  # two tiles, at least one line each
    assert loads == 0
