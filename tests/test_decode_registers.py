"""A decode launch's register bound (DecodeLaunch.max_registers, Triton's maxnreg): passed on
CUDA only (the interpreter has no registers), the tighter of it and a pairs launch's own bound,
and at 96 the fp8 cache's 2-stage launch compiles for sm_90 without spilling and fits one CTA an
SM more (ptxas, no GPU). Its speed is sweep_decode_large.py's to measure on the GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from test_kv_layout import (  # noqa: E402
    K_SCALE,
    V_SCALE,
    caches,
    engine_decode_inputs,
    slots_inner_copy,
)
from test_triton_kernels import DEVICE, nan_buffers  # noqa: E402, F401

from bulkgen.model.attention.decode_tiling import DecodeLaunch  # noqa: E402
from bulkgen.model.attention.kv_fp8 import FP8_DTYPE  # noqa: E402
from bulkgen.model.attention.triton_decode import launch_registers, paged_decode  # noqa: E402
from bulkgen.model.attention.triton_kv_pairs import PAIRS_MAX_REGISTERS  # noqa: E402

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_the_bound_is_passed_on_cuda_only_and_the_tighter_one_wins():
    capped = DecodeLaunch(128, 4, 2, max_registers=96)
    assert launch_registers(capped, False, CUDA) == {"maxnreg": 96}
    assert launch_registers(capped, True, CUDA) == {"maxnreg": min(96, PAIRS_MAX_REGISTERS)}
    assert launch_registers(DecodeLaunch(128), True, CUDA) == {"maxnreg": PAIRS_MAX_REGISTERS}
    assert launch_registers(DecodeLaunch(128), False, CUDA) == {}
    assert launch_registers(capped, False, CPU) == launch_registers(capped, True, CPU) == {}


@pytest.mark.usefixtures("nan_buffers")
def test_a_bounded_launch_gives_the_same_outputs():
    torch.manual_seed(0)
    seq_lens = [1, 17, 64, 65, 200, 0]
    k, v, tables, _ = caches(seq_lens, 16, 2, 32, FP8_DTYPE)
    v = slots_inner_copy(v)
    q = torch.randn(len(seq_lens), 8, 32, device=DEVICE).to(torch.float16)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    args = (q, k, v, lens, tables, 32**-0.5, 1)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    launch = DecodeLaunch(64, prefetch_blocks=True)
    plain = paged_decode(*args, launch=launch, **scales)
    bounded = paged_decode(*args, launch=launch._replace(max_registers=96), **scales)
    assert torch.equal(bounded, plain)


def test_at_96_registers_the_fp8_launch_compiles_unspilled_for_one_cta_more():
    """sm_90a through Triton's bundled ptxas (scripts/kernel_resources.py, in a process of its own:
    this one may run the interpreter): 122-124 registers and 4 CTAs an SM unbounded (128 threads,
    41 KB of shared memory), 96 and 5 bounded, nothing spilled."""
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "scripts")])
    script = root / "scripts" / "kernel_resources.py"
    done = subprocess.run([sys.executable, str(script), "--register-bounds", "96"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    pattern = r"maxnreg=(\w+): (\d+) registers, (\d+) B spilled, \d+ B shared, CTAs/SM <= (\d+)"
    usage = {b: tuple(map(int, rest)) for b, *rest in re.findall(pattern, done.stdout)}
    assert usage["None"][1] == usage["96"][1] == 0, "nothing spilled"
    assert usage["None"][0] > 96 >= usage["96"][0]
    assert usage["96"][2] == usage["None"][2] + 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_the_launches_above_512_rows_give_the_512_row_launch_s_outputs():
    """At the 8B attention shape over the engine's fp8 cache, 600 rows: the table's launch above
    512 rows and the same bounded to 96 registers give the 512-row launch's bits (pipelining and
    register allocation move loads, not arithmetic)."""
    from bulkgen.model.attention.decode_tiling import decode_launch

    torch.manual_seed(0)
    rows = 600
    args, scales = engine_decode_inputs(rows, FP8_DTYPE)
    above = decode_launch(128, True, rows)
    assert above != decode_launch(128, True, 512), "the table has an entry above 512 rows"
    expected = paged_decode(*args, launch=decode_launch(128, True, 512), **scales)
    for launch in (above, above._replace(num_stages=2, max_registers=96)):
        assert torch.equal(paged_decode(*args, launch=launch, **scales), expected), launch
