"""Environment switches that change which kernels run, for A/B runs on the GPU machine: their
names, the ones stats.json's env_overrides reports (KERNEL_SWITCHES), the on/off reader (switch)
and the load-time check (apply_switches)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

# PDL launches (pdl.py), the SiLU's form (fp8_fused.py), the 16-bit GEMMs' library (BULKGEN_BLAS:
# cublas or cublaslt, blas_library below), and those of 1 or 0 (unset: the default), e.g. the
# e4m3 rounding left to the cast (fp8_kernels.HW_ROUNDING).
PDL_ENV = "BULKGEN_FP8_PDL"
SILU_FORM_ENV = "BULKGEN_SILU_FORM"
HW_ROUNDING_ENV = "BULKGEN_FP8_HW_ROUNDING"
PREFILL_F16_ENV = "BULKGEN_PREFILL_F16"
BLAS_ENV = "BULKGEN_BLAS"
BF16_ARGMAX_ENV = "BULKGEN_BF16_ARGMAX"  # 1: plain greedy steps skip the float32 logits
INT8_V_SLOTS_INNER_ENV = "BULKGEN_INT8_V_SLOTS_INNER"  # 0: int8 values in rows (kv_layout.py)
INT8_F16_ASM_ENV = "BULKGEN_INT8_F16_ASM"  # 0: int8 tiles widened by a cast (triton_kv.py)
ATTN_FP8_PV_ENV = "BULKGEN_ATTN_FP8_PV"  # 1: an fp8 cache's prefill P @ V in e4m3 (kv_fp8.py)
SILU_GEMM_ENV = "BULKGEN_FP8_SILU_GEMM"  # 0: gate_up's GEMM leaves the SiLU (fp8_gemm_silu.py)
ATTN_ROWS_ENV = "BULKGEN_FP8_ATTN_ROWS"  # 0: o_proj quantizes attention's output (llama.py)
DECODE_MMA_ENV = "BULKGEN_FP8_DECODE_MMA"  # 1: fp8-cache decode on e4m3 products (decode_mma.py)
DECODE_ROTARY_ENV = "BULKGEN_DECODE_ROTARY"  # 0: a decode step's rotary apart (decode_rotary.py)
K_HEADS_OUTER_ENV = "BULKGEN_K_HEADS_OUTER"  # 1: keys stored heads outer (kv_layout.py)
KV_RUNS_ENV = "BULKGEN_KV_RUNS"  # 0: prefill's fp8 values a token a program (triton_kv_runs)
KERNEL_SWITCHES = (PDL_ENV, SILU_FORM_ENV, HW_ROUNDING_ENV, PREFILL_F16_ENV, BLAS_ENV)
KERNEL_SWITCHES += (BF16_ARGMAX_ENV, ATTN_FP8_PV_ENV, INT8_V_SLOTS_INNER_ENV, INT8_F16_ASM_ENV)
KERNEL_SWITCHES += (SILU_GEMM_ENV, ATTN_ROWS_ENV, DECODE_MMA_ENV, "BULKGEN_FP8_GEMM_TABLE")
KERNEL_SWITCHES += (DECODE_ROTARY_ENV, "BULKGEN_DECODE_TILINGS", K_HEADS_OUTER_ENV)
KERNEL_SWITCHES += (KV_RUNS_ENV,)
BLAS_LIBRARIES = ("cublas", "cublaslt")
# cuBLASLt picks its kernels by other heuristics than cuBLAS (torch's default): on the H200 at
# 161440a (one call, bf16) blog ran 5,233 tok/s through cuBLASLt, 5,071 through cuBLAS (decode
# steps 6.01 vs 6.20 ms), bulk 11,220 vs 11,151; through cuBLAS the decode graphs of 416 and 448
# rows were slower than at 480 (graph_buckets_replaced), through cuBLASLt only 448's.
DEFAULT_BLAS = "cublaslt"


def blas_library(device: torch.device) -> str | None:
    """The library torch's 16-bit GEMMs go through on CUDA: BULKGEN_BLAS, else DEFAULT_BLAS (None
    on other devices unless named: nothing to set there). Set for the process at model load."""
    name = os.environ.get(BLAS_ENV) or None
    if name is not None and name not in BLAS_LIBRARIES:
        raise ValueError(f"{BLAS_ENV} must be one of {', '.join(BLAS_LIBRARIES)}, got {name!r}")
    if device.type == "cuda" and torch.version.hip is None:
        name = name or DEFAULT_BLAS
        torch.backends.cuda.preferred_blas_library(name)
    return name


def apply_switches(device: torch.device) -> None:
    """At model load, each process: the on/off switches' values checked (a bad one fails the
    load in one line, not a step mid-run) and BULKGEN_BLAS's library set (blas_library)."""
    on_off = (HW_ROUNDING_ENV, PREFILL_F16_ENV, BF16_ARGMAX_ENV, ATTN_FP8_PV_ENV)
    for name in (*on_off, SILU_GEMM_ENV, ATTN_ROWS_ENV, DECODE_MMA_ENV, DECODE_ROTARY_ENV,
                 K_HEADS_OUTER_ENV, KV_RUNS_ENV):  # fmt: skip
        switch(name, False)
    blas_library(device)


def table_file(env: str, default: Path) -> Path:
    """A measured table's file: the one the environment variable `env` names (A/B runs of two
    tables in one call; a name that is no file is an error, not "no table"), else `default`."""
    named = os.environ.get(env)
    if named and not Path(named).is_file():
        raise FileNotFoundError(f"{env} names {named}, which is not a file")
    return Path(named) if named else default


def switch(name: str, default: bool) -> bool:
    """An on/off kernel switch: the environment's 1 or 0, else `default`."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 1 or 0, got {value!r}")
    return value == "1"
