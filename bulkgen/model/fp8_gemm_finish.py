"""The end of an FP8 GEMM program (fp8_gemm.py's kernel and fp8_gemm_tma.py's): its float32
tile scaled by the rows' and the weight rows' scales and rounded once, or stored as one K split's
partial sums, which the last split of the tile to finish adds in split order (fixup)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def finish_tile(
    acc, rows, cols, row_ok, M, N, stride_om, x_scale_ptr, w_scale_ptr, out_ptr, part_ptr,
    count_ptr, SPLIT_K: tl.constexpr, FIXUP: tl.constexpr,
):  # fmt: skip
    """A program's float32 tile acc [BLOCK_M, BLOCK_N] to the output: scaled and rounded, or as
    K split pid_k's partial sums (added by _reduce_splits_kernel, or here by the last split of
    the tile to finish: FIXUP)."""
    mask = row_ok[:, None] & (cols[None, :] < N)
    offsets = rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    if SPLIT_K == 1:
        store_scaled(acc, rows, cols, row_ok, x_scale_ptr, w_scale_ptr, out_ptr, offsets, mask, N)
    else:  # float32 partial sums [SPLIT_K, M, N], added by _reduce_splits_kernel or below
        pid_k = tl.program_id(2)
        tl.store(part_ptr + pid_k.to(tl.int64) * M * N + offsets, acc, mask=mask)
        if FIXUP:
            # Every thread's partial is stored before the count (the barrier), and released to
            # the GPU with it; the split that counts last acquires the others' and adds all of
            # them in split order (the same bits whichever finishes last), then zeroes the
            # count for the next launch (a CUDA graph replays this one).
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                total = tl.zeros_like(acc)
                for split in range(SPLIT_K):
                    total += tl.load(
                        part_ptr + split * M * N + offsets,
                        mask=mask,
                        other=0.0,
                        cache_modifier=".cg",
                    )
                store_scaled(
                    total, rows, cols, row_ok, x_scale_ptr, w_scale_ptr, out_ptr, offsets, mask, N
                )
                tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def store_scaled(acc, rows, cols, row_ok, x_scale_ptr, w_scale_ptr, out_ptr, offsets, mask, N):
    """out = acc * x_scale[m] * w_scale[n] (in _scaled_mm's order), rounded once."""
    x_scale = tl.load(x_scale_ptr + rows, mask=row_ok, other=0.0)
    w_scale = tl.load(w_scale_ptr + cols, mask=cols < N, other=0.0)
    out = acc * x_scale[:, None] * w_scale[None, :]
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)
