"""The FP8 GEMM of fp8_gemm.py with its tiles fetched by the Hopper TMA (Fp8GemmConfig.tma): the
same programs, K splits, dots and end (fp8_gemm_finish.py), so the same bits, with each K tile of
the weight and of the rows brought into shared memory by one bulk tensor copy instead of each
thread's cp.async loads. At blog's 32 rows the pointer kernel streams the FP8 weights at 2.0-3.4
TB/s (tune_fp8_mm.py on the H200, 0b8e823: qkv 25 MB in 11.6 us, gate_up 117 MB in 39.3 us),
where reading them at the H200's 4.8 TB/s would take about half; whether the TMA's copies get
nearer is for tune_fp8_mm.py to measure (candidates named ...d).

The TMA bounds-checks against each descriptor's shape: rows past M or N, and K past its end,
arrive as zeros and cost no memory traffic, so no load here is masked. Descriptors are made on
the host at each call (the rows' address and count change per call) and a CUDA graph captures
them by value, as any kernel argument. The TMA needs 16-byte aligned rows and addresses: a call
whose operands are not takes the pointer kernel with the same config (tma_launch returns None),
the same product. Not launched with PDL (pdl.py): the pointer kernel waits for its producer
before it reads, this one has no such wait.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from bulkgen.model.fp8_gemm import _dot
from bulkgen.model.fp8_gemm_configs import Fp8GemmConfig
from bulkgen.model.fp8_gemm_finish import finish_tile


# The arguments of fp8_gemm._fp8_gemm_kernel, so that one launch serves both: x and w are
# descriptors here, and the strides, DOT (always fp8), EVEN_K and the PDL ones go unused.
@triton.jit(do_not_specialize=["M"])
def _fp8_gemm_tma_kernel(
    x_desc,  # [M, K] fp8, tiles [BLOCK_M, BLOCK_K]
    w_desc,  # [N, K] fp8, tiles [BLOCK_N, BLOCK_K]
    x_scale_ptr,
    w_scale_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    FIXUP: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
    PDL_TILES: tl.constexpr,
    PDL_LINES: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, tiles)
    if SWAP_AB:  # acc[n, m]: weight tile [BLOCK_N, BLOCK_K] @ rows [BLOCK_K, BLOCK_M]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(first, last):
        x = x_desc.load([pid_m * BLOCK_M, t * BLOCK_K])
        w = w_desc.load([pid_n * BLOCK_N, t * BLOCK_K])
        if SWAP_AB:
            acc = _dot(acc, w, x.T, "fp8", FAST_ACCUM)
        else:
            acc = _dot(acc, x, w.T, "fp8", FAST_ACCUM)
    if SWAP_AB:
        acc = tl.trans(acc)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    finish_tile(acc, rows, cols, rows < M, M, N, stride_om, x_scale_ptr, w_scale_ptr, out_ptr,
                part_ptr, count_ptr, SPLIT_K, FIXUP)  # fmt: skip


def tma_aligned(t: torch.Tensor) -> bool:
    """Whether the TMA can read t [R, C]: unit column stride, rows and address 16-byte aligned."""
    row_bytes = t.stride(0) * t.element_size()
    return t.stride(-1) == 1 and row_bytes % 16 == 0 and t.data_ptr() % 16 == 0


def tma_launch(xq: torch.Tensor, wq: torch.Tensor, cfg: Fp8GemmConfig):
    """(kernel, x descriptor, w descriptor) for fp8_gemm's launch of cfg, or None where the TMA
    cannot read xq [M, K] or wq [N, K] (the pointer kernel then runs cfg)."""
    if not (tma_aligned(xq) and tma_aligned(wq)):
        return None
    (m, k), n = xq.shape, wq.shape[0]
    x_desc = TensorDescriptor(xq, [m, k], [xq.stride(0), 1], [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor(wq, [n, k], [wq.stride(0), 1], [cfg.block_n, cfg.block_k])
    return _fp8_gemm_tma_kernel, x_desc, w_desc
