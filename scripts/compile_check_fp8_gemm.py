"""Compile the Triton FP8 GEMM (bulkgen/model/fp8_gemm.py) for sm_90 without a GPU, every
candidate launch, and say how its operands reach the tensor cores.

    PYTHONPATH=. python scripts/compile_check_fp8_gemm.py

The interpreter runs the kernel as Python and never meets the GPU compiler. Each candidate is
compiled as the JIT specializes it at run time for the 8B shapes (pointers, N, K and the strides
divisible by 16, K a multiple of BLOCK_K) and one line printed: its MMA instruction (wgmma on
e4m3 operands, or mma.sync on f16 ones that Triton widened the e4m3 tiles to) and its e4m3
conversions (cvt ... e4m3: the widening, in registers), and its cp.async copies (the weight
tiles pipelined into shared memory) and float32 adds (how fp8 MMA sums reach the float32
accumulator), and its acquire-release atomics at GPU scope (the tile count of a launch that adds
its own K splits: fixup, names ending in "f"). A tma candidate (names ending in "d",
fp8_gemm_tma.py) takes its operands as TMA descriptors: its copies are bulk tensor copies
(cp.async.bulk.tensor). A few candidates are compiled again with fast
accumulation (EngineConfig.fp8_fast_accum: lines named NAME_fast), whose fp8 MMAs keep their sums
in the tensor cores' accumulator: no float32 adds. The split-K reduction is compiled too.
"""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bulkgen.model.fp8_gemm import (
    CANDIDATES,
    REDUCE_BLOCK,
    Fp8GemmConfig,
    _fp8_gemm_kernel,
    _reduce_splits_kernel,
)
from bulkgen.model.fp8_gemm_tma import _fp8_gemm_tma_kernel

TARGET = GPUTarget("cuda", 90, 32)
# Compiled again with FAST_ACCUM: a plain tile on wgmma, a swapped one, and a 16-row one that
# Triton widens to fp16 (where fast accumulation changes nothing).
FAST_SAMPLES = ("m64n64k128s2", "m16n64k128s4t", "m16n64k128s4")


def _aligned(signature: dict[str, str], names: tuple[str, ...]) -> dict:
    """Divisibility-16 attributes, as the JIT gives pointers and integers divisible by 16."""
    order = list(signature)
    return {(order.index(n),): [["tt.divisibility", 16]] for n in names}


def gemm_ptx(cfg: Fp8GemmConfig, fast_accum: bool = False, pdl_tiles: int = 0) -> str:
    operands = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv"}
    kernel = _fp8_gemm_kernel
    if cfg.tma:  # operands as TMA descriptors of the tiles' shapes
        kernel = _fp8_gemm_tma_kernel
        operands = {
            "x_desc": f"tensordesc<fp8e4nv[{cfg.block_m},{cfg.block_k}]>",
            "w_desc": f"tensordesc<fp8e4nv[{cfg.block_n},{cfg.block_k}]>",
        }
    signature = {
        **operands,
        "x_scale_ptr": "*fp32",
        "w_scale_ptr": "*fp32",
        "out_ptr": "*bf16",
        "part_ptr": "*fp32",
        "count_ptr": "*i32" if cfg.fixup else "*fp32",
        **{name: "i32" for name in ("M", "N", "K", "stride_xm", "stride_wn", "stride_om")},
    }
    constexprs = {
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
        "SPLIT_K": cfg.split_k,
        "SWAP_AB": cfg.swap_ab,
        "DOT": cfg.dot,
        "EVEN_K": True,
        "FIXUP": cfg.fixup,
        "FAST_ACCUM": fast_accum,
        "PDL_TILES": pdl_tiles,
        "PDL_LINES": max(1, cfg.block_k // 128),
    }
    signature |= {name: "constexpr" for name in constexprs}
    aligned = ("x_scale_ptr", "w_scale_ptr", "out_ptr", "part_ptr", "N", "K")
    aligned += ("stride_xm", "stride_wn", "stride_om") + ("x_ptr", "w_ptr") * (not cfg.tma)
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=_aligned(signature, aligned))
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(source, target=TARGET, options=options).asm["ptx"]


def reduce_ptx() -> str:
    signature = {"part_ptr": "*fp32", "x_scale_ptr": "*fp32", "w_scale_ptr": "*fp32"}
    signature |= {"out_ptr": "*bf16", "M": "i32", "N": "i32"}
    constexprs = {"SPLIT_K": 4, "BLOCK": REDUCE_BLOCK}
    signature |= {name: "constexpr" for name in constexprs}
    source = ASTSource(_reduce_splits_kernel, signature, constexprs=constexprs)
    return triton.compile(source, target=TARGET).asm["ptx"]


def mma_kind(ptx: str) -> str:
    """The tensor-core instruction and its operand types, e.g. wgmma.m64n16k32.e4m3.e4m3."""
    if m := re.search(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.f32\.(\w+)\.(\w+)", ptx):
        return f"wgmma.{m[1]}.{m[2]}.{m[3]}"
    if m := re.search(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)\.row\.col\.f32\.(\w+)\.(\w+)", ptx):
        return f"mma.sync.{m[1]}.{m[2]}.{m[3]}"
    return "none"


def e4m3_conversions(ptx: str) -> int:
    return len(re.findall(r"\bcvt\.[^;]*e4m3", ptx))


def async_copies(ptx: str) -> int:
    """cp.async instructions: global-to-shared copies the software pipeline issues ahead, each
    thread's own or the TMA's bulk tensor copies."""
    return len(re.findall(r"\bcp\.async\.(c[ag]|bulk\.tensor)\b", ptx))


def float32_adds(ptx: str) -> int:
    """add.f32 instructions: with precise accumulation, each fp8 MMA's sums join the float32
    accumulator this way (Triton's sm_90 default would leave them in the MMA's accumulator)."""
    return len(re.findall(r"\badd\.f32\b", ptx))


def gpu_atomics(ptx: str) -> int:
    """atom instructions at GPU scope with acquire-release order: the tile count of a launch
    adding its own K splits (the partials stored before it are visible to whoever counts last)."""
    atomics = re.findall(r"\batom\.[\w.:]+", ptx)
    return sum(".gpu." in a and ".acq_rel." in a for a in atomics)


PDL_SAMPLES = ("m16n64k128s4tf", "m16n64k256s2tfp3")  # 1 and 2 lines a weight row a K tile


def main() -> None:
    launches = [(name, cfg, False) for name, cfg in CANDIDATES.items()]
    launches += [(f"{name}_fast", CANDIDATES[name], True) for name in FAST_SAMPLES]
    for name, cfg, fast in launches:
        ptx = gemm_ptx(cfg, fast)
        counts = f"{e4m3_conversions(ptx)} e4m3 conversions, {async_copies(ptx)} async copies, "
        counts += f"{float32_adds(ptx)} f32 adds, {gpu_atomics(ptx)} acq_rel atomics"
        print(f"{name:21s}: {len(ptx):6d} chars of PTX, mma {mma_kind(ptx)}, {counts}")
    print(f"{'reduce':16s}: {len(reduce_ptx()):6d} chars of PTX")
    for name in (name for name, cfg in CANDIDATES.items() if cfg.tma):  # the TMA's copies only
        ptx = gemm_ptx(CANDIDATES[name])
        bulk = len(re.findall(r"\bcp\.async\.bulk\.tensor\b", ptx))
        print(f"tma {name}: {bulk} bulk tensor copies, {async_copies(ptx) - bulk} thread copies")
    # Launched with PDL (bulkgen/model/pdl.py): weight lines asked of L2, then one grid wait.
    for name in PDL_SAMPLES:
        ptx = gemm_ptx(CANDIDATES[name], True, pdl_tiles=2)
        prefetches = len(re.findall(r"\bprefetch\.global\.L2\b", ptx))
        waits = len(re.findall(r"\bgriddepcontrol\.wait\b", ptx))
        print(f"pdl {name}: {prefetches} L2 prefetches, {waits} grid waits")


def silu_ptx(cfg: Fp8GemmConfig) -> str:
    """fp8_gemm_silu.py's kernel (gate_up with the SiLU in its epilogue) for a fused launch."""
    from bulkgen.model.fp8_gemm_silu import _gate_up_silu_kernel

    signature = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "x_scale_ptr": "*fp32"}
    signature |= {"w_scale_ptr": "*fp32", "h_ptr": "*bf16", "absmax_ptr": "*fp32"}
    signature |= {name: "i32" for name in ("M", "I", "K", "stride_xm", "stride_wn")}
    constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k}
    constexprs |= {"SWAP_AB": cfg.swap_ab, "DOT": cfg.dot, "EVEN_K": True, "FAST_ACCUM": True}
    constexprs |= {"LIBDEVICE_EXP": True}
    signature |= {name: "constexpr" for name in constexprs}
    aligned = ("x_ptr", "w_ptr", "x_scale_ptr", "w_scale_ptr", "h_ptr", "I", "K")
    aligned += ("stride_xm", "stride_wn")
    source = ASTSource(
        _gate_up_silu_kernel, signature, constexprs=constexprs, attrs=_aligned(signature, aligned)
    )
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(source, target=TARGET, options=options).asm["ptx"]


def check_silu(names: list[str]) -> None:
    """--silu NAME...: the fused launch fp8_gemm_silu.fused_config derives from each candidate."""
    from bulkgen.model.fp8_gemm_silu import fused_launch

    for name in names:
        cfg = fused_launch(CANDIDATES[name])
        ptx = silu_ptx(cfg)
        fused = f"m{cfg.block_m}n{cfg.block_n}k{cfg.block_k}s1" + "t" * cfg.swap_ab
        local = len(re.findall(r"\bld\.local\b", ptx))
        print(f"silu {fused}: mma {mma_kind(ptx)}, {async_copies(ptx)} async copies, "
              f"{local} local loads")  # fmt: skip


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--silu"]:
        check_silu(sys.argv[2:])
    else:
        main()
