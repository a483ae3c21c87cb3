"""Decode launches of the engine's kernel (its tuned launch, value layout and block size) for
Nsight Compute: fp8 or bf16 cache, rows x context (default 256 x 2048, the 8B shape).

    ncu --clock-control none -k regex:_decode_split --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python scripts/ncu_decode.py fp8 32 1408

(--clock-control none: ncu otherwise locks the GPU's clocks while it profiles.) Three launches:
the first two compile and warm. 32 x 1408 is blog's decode step (32 rows, about 1.4K context
mid-run), where the fp8 kernel read about 2.0 TB/s in a run's profile (4489b1e).
"""

from __future__ import annotations

import sys

import torch
from bench_attention import HEAD_DIM, paged_inputs

from bulkgen.model.attention.decode_tiling import fp8_v_slots_inner
from bulkgen.model.attention.kv_layout import block_size_for, to_slots_inner
from bulkgen.model.attention.triton_decode import paged_decode

kind = sys.argv[1] if len(sys.argv) > 1 else "fp8"
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 256
context = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
dtype = torch.float8_e4m3fn if kind == "fp8" else torch.bfloat16
slots_inner = kind == "fp8" and fp8_v_slots_inner()
block_size = block_size_for(slots_inner)  # the engine's: 64-token blocks for slots inner
q, k, v, meta, _ = paged_inputs([context] * rows, [1] * rows, True, dtype, block_size)
if slots_inner:
    v = to_slots_inner(v)
for _ in range(3):
    paged_decode(q, k, v, meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5)
torch.cuda.synchronize()
