"""One fp8 and one bf16 decode launch at 256 rows x 2K (the 8B shape) for Nsight Compute.

    ncu --clock-control none -k regex:_decode_split --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python scripts/ncu_decode.py fp8

(--clock-control none: ncu otherwise locks the GPU's clocks while it profiles.) Three launches
of the engine's kernel with its tuned launch and value layout: the first two compile and warm.
"""

from __future__ import annotations

import sys

import torch
from bench_attention import HEAD_DIM, paged_inputs

from bulkgen.model.attention.decode_tiling import fp8_v_slots_inner
from bulkgen.model.attention.kv_layout import to_slots_inner
from bulkgen.model.attention.triton_decode import paged_decode

kind = sys.argv[1] if len(sys.argv) > 1 else "fp8"
dtype = torch.float8_e4m3fn if kind == "fp8" else torch.bfloat16
q, k, v, meta, _ = paged_inputs([2048] * 256, [1] * 256, True, dtype)
if kind == "fp8" and fp8_v_slots_inner():
    v = to_slots_inner(v)
for _ in range(3):
    paged_decode(q, k, v, meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5)
torch.cuda.synchronize()
