"""The launches of the Triton FP8 GEMM (fp8_gemm.py): tiles, K splits, warps, stages and how the
operands meet the tensor cores (Fp8GemmConfig), and the candidates scripts/tune_fp8_mm.py times
at each projection and row count (CANDIDATES, by name)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8GemmConfig:
    """One launch of the kernel: tiles, K splits, warps, pipeline stages, operand handling."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    swap_ab: bool = False
    dot: str = "fp8"  # "fp8" or "fp16" (see the module docstring)
    # Split K's partial sums added by the last split of each output tile to finish, in the same
    # launch (tile counters, see fp8_gemm), instead of by a second kernel.
    fixup: bool = False
    # Tiles fetched by the Hopper TMA (fp8_gemm_tma.py) rather than by each thread's loads.
    tma: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "split_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Fp8GemmConfig.{name} must be a power of two, got {value}")
        if min(self.block_m, self.block_n) < 16 or self.block_k < 32:
            raise ValueError(f"Fp8GemmConfig tiles must be >= 16, block_k >= 32 (tl.dot): {self}")
        if self.dot not in ("fp8", "fp16"):
            raise ValueError(f"Fp8GemmConfig.dot must be fp8 or fp16, got {self.dot!r}")
        if self.tma and (self.dot != "fp8" or self.block_k > 128):
            raise ValueError(f"a tma Fp8GemmConfig takes fp8 dots and 128-byte K tiles: {self}")


def _candidates() -> dict[str, Fp8GemmConfig]:
    """Launches scripts/tune_fp8_mm.py times, named like m16n64k128s4t (s: K splits, t: swap_ab,
    h: fp16 operands). In the sm_90 PTX (scripts/compile_check_fp8_gemm.py) a 16-row tile that
    is not swapped becomes mma.sync on fp16 (Triton widens the e4m3 tiles), a swapped one or one
    of 64 rows wgmma on e4m3. Enough programs for 132 SMs at N = 4096 needs split_k * 4096 /
    block_n >= 128 or so."""
    out = {}
    for block_m, block_n, block_k, split_k, swap, dot in [
        (16, 64, 128, 1, True, "fp8"),
        (16, 64, 128, 2, True, "fp8"),
        (16, 64, 128, 4, True, "fp8"),
        (16, 64, 256, 2, True, "fp8"),
        (16, 64, 256, 4, True, "fp8"),
        (16, 128, 128, 1, True, "fp8"),
        (16, 128, 128, 2, True, "fp8"),
        (16, 128, 256, 4, True, "fp8"),
        (16, 64, 128, 4, True, "fp16"),
        (16, 64, 128, 4, False, "fp8"),
        (32, 64, 128, 1, True, "fp8"),
        (32, 64, 128, 2, True, "fp8"),
        (32, 64, 128, 4, True, "fp8"),
        (64, 64, 128, 1, True, "fp8"),
        (64, 64, 128, 2, True, "fp8"),
        (64, 128, 128, 1, True, "fp8"),
        (64, 64, 128, 2, False, "fp8"),
        (64, 128, 128, 1, False, "fp8"),
        (128, 64, 128, 1, True, "fp8"),
        (128, 128, 128, 1, False, "fp8"),
    ]:
        name = f"m{block_m}n{block_n}k{block_k}s{split_k}" + "t" * swap + "h" * (dot == "fp16")
        out[name] = Fp8GemmConfig(block_m, block_n, block_k, split_k, swap_ab=swap, dot=dot)
        if split_k > 1:  # the same launch adding its splits itself: name + "f"
            out[name + "f"] = dataclasses.replace(out[name], fixup=True)
    # More weight bytes in flight a program (deeper pipelines, longer K tiles, wider N tiles on
    # 8 warps) for the rows where a step's GEMMs stream their weight: at blog's 32 rows the
    # table's launches read the FP8 weights at about 3.0 TB/s (4489b1e's profile, 2.32 ms a
    # step for 7.0 GB). Named with p<stages> and w<warps> where those are not 4.
    for block_m, block_n, block_k, split_k, stages, warps in [
        (16, 64, 128, 4, 6, 4),
        (16, 64, 256, 2, 3, 4),
        (16, 128, 128, 2, 4, 8),
        (32, 64, 256, 2, 3, 4),
        (32, 128, 128, 2, 4, 8),
    ]:
        name = f"m{block_m}n{block_n}k{block_k}s{split_k}tf"
        name += f"p{stages}" * (stages != 4) + f"w{warps}" * (warps != 4)
        out[name] = Fp8GemmConfig(
            block_m, block_n, block_k, split_k, warps, stages, swap_ab=True, fixup=True
        )
    # Tall tiles for 128-1,024 rows (a decode step of the bulk and trt workloads, a mixed step's
    # share), where a step's GEMMs turn compute-bound: at 256 rows cuBLASLt ran gate_up at 1,049
    # TFLOPS and the 4-warp candidates above at half that (tune_fp8_mm.py on the H200, 783479e).
    # Two warpgroups share a 128-row tile, as Triton's Hopper matmul tutorial launches FP8.
    for block_m, block_n, stages, warps in [
        (64, 256, 4, 4),
        (128, 128, 3, 8),
        (128, 128, 4, 8),
        (128, 256, 3, 8),
        (256, 128, 3, 8),
    ]:
        name = f"m{block_m}n{block_n}k128s1p{stages}w{warps}"
        out[name] = Fp8GemmConfig(block_m, block_n, 128, 1, warps, stages)
    # Tiles for gate_up with the SiLU in its epilogue (fp8_gemm_silu.py) at 256 rows and more,
    # where each program holds a gate and an up accumulator: BLOCK_N is half the weight rows
    # a K step reads, so these read 128-256 rows a step as the tall tiles above do.
    for block_m, block_n, stages, warps in [(128, 64, 4, 8), (128, 64, 5, 8), (256, 64, 3, 8)]:
        name = f"m{block_m}n{block_n}k128s1p{stages}w{warps}"
        out[name] = Fp8GemmConfig(block_m, block_n, 128, 1, warps, stages)
    out["m64n128k128s1p3"] = Fp8GemmConfig(64, 128, 128, 1, 4, 3)
    # The launches the table picks at 1-128 rows, and deeper ones, with their tiles fetched by
    # the TMA (name + "d"): one bulk copy a tile, issued by one thread, where each thread's
    # cp.async loads reach 2.0-3.4 TB/s at 32 rows (tune_fp8_mm.py on the H200, 0b8e823).
    for block_m, block_n, split_k, stages, fixup in [
        (16, 64, 1, 4, False),
        (16, 64, 2, 4, True),
        (16, 64, 4, 4, True),
        (16, 64, 4, 8, True),
        (16, 128, 1, 4, False),
        (16, 128, 2, 6, True),
        (32, 64, 2, 4, True),
        (64, 64, 1, 4, False),
        # 32-row tiles unsplit: at blog's 32 rows gate_up's 448 weight tiles make enough programs,
        # and each tile then crosses L2 once (the 16-row launch reads it twice: L2 80% busy under
        # Nsight Compute at c5e5448, the weight streamed at 3.33 TB/s).
        (32, 64, 1, 4, False),
        (32, 64, 1, 6, False),
        (32, 128, 1, 4, False),
    ]:
        name = f"m{block_m}n{block_n}k128s{split_k}t" + "f" * fixup
        name += f"p{stages}" * (stages != 4) + "d"
        out[name] = Fp8GemmConfig(
            block_m, block_n, 128, split_k, 4, stages, swap_ab=True, fixup=fixup, tma=True
        )
    return out


CANDIDATES: dict[str, Fp8GemmConfig] = _candidates()
