"""The FP8 GEMMs of a blog decode step (32 rows, the 8B shape) for Nsight Compute: each projection
through the launch the table chose for it (bulkgen/model/fp8_gemm_table.json), as Fp8Linear runs
it, fast accumulation on (the engine's default).

    ncu --clock-control none -k regex:_fp8_gemm --launch-skip 8 --launch-count 4 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python scripts/ncu_fp8_gemm.py 32

(--clock-control none: ncu otherwise locks the GPU's clocks.) Three rounds of qkv, o, gate_up and
down, each on its own weight (the first two rounds compile and warm; skip their 8 launches, or
more where a projection's launch adds a second, the split-K reduction). Why: at 32 rows the
table's launches read the FP8 weights at about 3.0 TB/s in a run (4489b1e's profile: 2.32 ms of a
4.84 ms step for 7.0 GB); the copy bandwidth is about 4.2-4.8 TB/s. One line per projection first:
the table's choice for it at these rows.
"""

from __future__ import annotations

import sys

import torch

from bulkgen.model.fp8 import quantize_rows_reference, quantize_weight
from bulkgen.model.fp8_gemm_table import fp8_matmul, gemm_choice, tile_counters_needed

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 32
dev = torch.device("cuda")
calls = []
for name, (n, k) in SHAPES.items():
    wq, w_scale = quantize_weight(torch.randn(n, k, device=dev) / k**0.5)
    xq, x_scale = quantize_rows_reference(torch.randn(rows, k, device=dev))
    counters = torch.zeros(max(1, tile_counters_needed(n, k)), dtype=torch.int32, device=dev)
    calls.append((xq, x_scale, wq, w_scale, counters))
    print(f"{name} {n}x{k} at {rows} rows: {gemm_choice(n, k, rows) or 'scaled_mm'}", flush=True)
for _ in range(3):
    for xq, x_scale, wq, w_scale, counters in calls:
        fp8_matmul(xq, x_scale, wq, w_scale, counters, fast_accum=True)
torch.cuda.synchronize()
