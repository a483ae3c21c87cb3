"""Compile the batch-invariant matmul kernel for sm_90 without a GPU (the interpreter skips the
GPU compiler), once per candidate tiling and dtype.

    PYTHONPATH=. python scripts/compile_check_invariant_mm.py [--configs NAME,...]

Each line: the config, its shared memory (an H200 block may use at most 227 KB), whether the
PTX uses Hopper's wgmma (warpgroup MMA), the loads' pipelining (cp.async) and, for tma=True
configs (invariant_tma.py), the TMA's bulk tensor copies. The launch
arguments are specialised as a real launch does: unit strides are constants, pointers and the
other integers divisible by 16 (Llama's shapes are).
"""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bulkgen.model import invariant_matmul as im
from bulkgen.model import invariant_tma

H200_SHARED = 227 * 1024
DTYPES = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
INTS = ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym")


def compile_config(cfg: im.MatmulConfig, dtype: str, even_k: bool = True, bias: bool = False):
    ptr = DTYPES[dtype]
    constexprs = {
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
        "GROUP_M": cfg.group_m,
        "HAS_BIAS": bias,
        "IEEE": dtype == "fp32",
        "UPCAST": False,
    }
    if cfg.tma:
        kernel = invariant_tma._matmul_tma_kernel
        element = ptr.removeprefix("*")
        signature = {
            "x_desc": f"tensordesc<{element}[{cfg.block_m},{cfg.block_k}]>",
            "w_desc": f"tensordesc<{element}[{cfg.block_n},{cfg.block_k}]>",
        }
        signature |= {"bias_ptr": ptr, "y_ptr": ptr, "M": "i32", "N": "i32", "K": "i32"}
        signature |= {"stride_ym": "i32"}
    else:
        kernel = im._matmul_kernel
        signature = {"x_ptr": ptr, "w_ptr": ptr, "bias_ptr": ptr, "y_ptr": ptr}
        signature |= {name: "i32" for name in INTS}
        constexprs |= {"stride_xk": 1, "stride_wk": 1, "EVEN_K": even_k}
    signature |= {name: "constexpr" for name in constexprs}
    names = kernel.arg_names
    # M is not divisible by 16 in general (a decode step's rows); the rest are in Llama's shapes.
    aligned = [n for n in signature if signature[n] in ("i32", ptr) and n != "M"]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", help="candidate names (default: all, and the fp32 tiling)")
    args = parser.parse_args()
    configs = dict(im.CANDIDATES) | {"fp32_config": im.FP32_CONFIG}
    if args.configs:
        configs = {name: configs[name] for name in args.configs.split(",")}
    failed = 0
    for name, cfg in configs.items():
        for dtype in ("fp32",) if cfg is im.FP32_CONFIG else ("bf16", "fp16"):
            for even_k, bias in ((True, False), (False, True)):
                try:
                    kernel = compile_config(cfg, dtype, even_k, bias)
                except Exception as e:  # report every config, then fail
                    failed += 1
                    print(f"{name} {dtype}: FAILED {type(e).__name__}: {str(e)[:300]}")
                    continue
                ptx, shared = kernel.asm["ptx"], kernel.metadata.shared
                fits = "fits" if shared <= H200_SHARED else "TOO BIG"
                tma = "cp.async.bulk.tensor" in ptx
                print(
                    f"{name} {dtype} even_k={even_k} bias={bias}: shared {shared // 1024} KB "
                    f"({fits}), wgmma {'wgmma' in ptx}, cp.async {'cp.async' in ptx}, "
                    f"TMA {tma}, {len(ptx)} chars of PTX"
                )
                failed += cfg.tma != tma
                failed += shared > H200_SHARED
    if failed:
        raise SystemExit(f"{failed} compilations failed or do not fit")


if __name__ == "__main__":
    main()
