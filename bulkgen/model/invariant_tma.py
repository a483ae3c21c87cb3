"""The batch-invariant matmul with its tiles loaded by the Hopper TMA (a MatmulConfig with
tma=True): the same program per output tile, the same K order and accumulator as the pointer
kernel of invariant_matmul.py, with each tile fetched by one bulk tensor copy instead of per-thread
loads. The TMA bounds-checks against the descriptor's shape: rows past M and columns past K
arrive as zeros and cost no memory traffic.

The descriptors are made on the host at each call (x's shape and address change per call); a
CUDA graph captures them by value like any other kernel argument. TMA needs 16-byte aligned rows:
invariant_matmul picks this kernel only for a weight whose rows are (a property of the weight,
the same at every call, so a weight's rows always take the same kernel), and an x that is not
aligned is copied.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from bulkgen.model.invariant_matmul import mma, store_tile, tile_of


@triton.jit(do_not_specialize=["M"])
def _matmul_tma_kernel(
    x_desc,
    w_desc,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m, pid_n = tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # The invariant: one program, K in order from 0, one float32 accumulator, nothing split.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
        acc = mma(acc, a, b.T, IEEE, UPCAST)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    store_tile(acc, bias_ptr, y_ptr, rows, cols, M, N, stride_ym, HAS_BIAS)


def tma_aligned(t: torch.Tensor) -> bool:
    """Whether the TMA can read t [R, C]: unit column stride, rows and address 16-byte aligned."""
    row_bytes = t.stride(0) * t.element_size()
    return t.stride(-1) == 1 and row_bytes % 16 == 0 and t.data_ptr() % 16 == 0


def launch_tma(grid, x, weight, bias, y, flags: dict) -> None:
    """Run the TMA kernel: x [M, K], weight [N, K] (tma_aligned), y [M, N]; flags as
    invariant_matmul's. An x the TMA cannot read is copied first (the same values)."""
    if not tma_aligned(x):
        x = x.clone(memory_format=torch.contiguous_format)
    (M, K), N = x.shape, weight.shape[0]
    bm, bn, bk = flags["BLOCK_M"], flags["BLOCK_N"], flags["BLOCK_K"]
    x_desc = TensorDescriptor(x, [M, K], [x.stride(0), 1], [bm, bk])
    w_desc = TensorDescriptor(weight, [N, K], [weight.stride(0), 1], [bn, bk])
    _matmul_tma_kernel[grid](x_desc, w_desc, bias, y, M, N, K, y.stride(0), **flags)
