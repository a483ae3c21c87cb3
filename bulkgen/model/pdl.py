"""Programmatic dependent launch (PDL, sm_90 and later) for the Triton FP8 GEMM: an experiment, off
unless BULKGEN_FP8_PDL=1 (and the GPU and Triton support it).

A kernel launched with PDL may start while the kernel before it in the stream still runs, as soon
as every program of that one has called griddepcontrol.launch_dependents (or exited). Before it
reads anything that kernel wrote, or writes anything, it waits (griddepcontrol.wait: the prior
grid complete and its writes visible). The FP8 GEMM's weight is written by no kernel, so before
its wait each program brings the first K tiles of its weight rows into L2 (prefetch_l2): the
weight streams from memory while the RMSNorm, SiLU or quantizer that produces the GEMM's input
still runs, instead of after it (CUTLASS's Hopper GEMM with weight prefetch does the same). Those
kernels call launch_dependents as they start (all their programs are resident by then, so the
GEMM's programs take only SMs they leave idle: at blog's 32 rows, most of them).

Why: at 32 rows the FP8 GEMMs read their weights at about 3.0 TB/s (4489b1e's profile) and a
decode step is some 290 kernels, each starting from an empty pipeline. Whether it pays is for
gpu_check_fp8.sh's step `pdl` to measure.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from bulkgen.model.switches import PDL_ENV

ENV = PDL_ENV
PREFETCH_TILES = 2  # K tiles of its weight rows a GEMM program prefetches before its wait


@functools.cache
def _triton_supports_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda
    except ImportError:
        return False
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return "launch_pdl" in fields and hasattr(cuda, "gdc_wait")


def enabled(device: torch.device) -> bool:
    """PDL for kernels on this device: BULKGEN_FP8_PDL=1, a CUDA GPU of sm_90 or later, a Triton
    with launch_pdl. Never on the CPU (the interpreter has no grid dependencies)."""
    if device.type != "cuda" or os.environ.get(ENV) != "1" or not _triton_supports_pdl():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(device: torch.device) -> dict:
    """The launch keyword a kernel that waits (pdl_wait) takes to start early: {} when off."""
    return {"launch_pdl": True} if enabled(device) else {}


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines at ptrs (no registers filled, nothing waited for)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def pdl_wait():
    """Wait for the kernel before this one: complete, its writes visible."""
    tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_launch_dependents():
    """Let the next kernel, if launched with PDL, start on the SMs this one leaves free."""
    tl.extra.cuda.gdc_launch_dependents()
