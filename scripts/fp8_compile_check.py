"""Compile the FP8 Triton kernels for sm_90 without a GPU (the interpreter skips this compiler).

    PYTHONPATH=. python scripts/fp8_compile_check.py

Prints one line per kernel with the size of its PTX and whether it converts to e4m3 in hardware.
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bulkgen.model import fp8_fused, fp8_kernels, fp8_silu_rows, fp8_silu_split

FP8_OUT = {"q_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}
SPLIT_IN = {"gate_up_ptr": "*bf16", "absmax_ptr": "*fp32", "stash_ptr": "*bf16"}
SPLIT_IN |= {"I": "i32", "stride_row": "i32"}
NORM_INTS = {"n_rows": "i32", "H": "i32", "eps": "fp32", "stride_x": "i32", "stride_res": "i32"}
KERNELS = [
    (
        fp8_kernels._quantize_rows_kernel,
        {"x_ptr": "*bf16", **FP8_OUT, "static_scale_ptr": "*fp32", "K": "i32", "stride_x": "i32"},
        {"BLOCK": 2048, "STATIC": False, "ONE_PASS": False, "PDL": True, "HW_ROUND": False},
    ),
    (  # quantize_rows(one_pass=True) at the 8B hidden width
        fp8_kernels._quantize_rows_kernel,
        {"x_ptr": "*bf16", **FP8_OUT, "static_scale_ptr": "*fp32", "K": "i32", "stride_x": "i32"},
        {"BLOCK": 4096, "STATIC": False, "ONE_PASS": True, "PDL": False, "HW_ROUND": False},
    ),
    (
        fp8_fused._rms_norm_fp8_kernel,
        {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", **FP8_OUT}
        | {"new_res_ptr": "*bf16", **NORM_INTS},
        {"BLOCK_H": 4096, "ROWS": 1, "HAS_RESIDUAL": True, "PDL": True, "HW_ROUND": False},
    ),
    (
        fp8_fused._silu_and_mul_fp8_kernel,
        {"gate_up_ptr": "*bf16", **FP8_OUT, "I": "i32", "stride_row": "i32"},
        {"BLOCK": 2048, "LIBDEVICE_EXP": True, "ONE_PASS": False, "PDL": False, "HW_ROUND": False},
    ),
    (  # silu_and_mul_fp8(one_pass=True) at the 8B shape's width (14,336 in a 16,384 tile)
        fp8_fused._silu_and_mul_fp8_kernel,
        {"gate_up_ptr": "*bf16", **FP8_OUT, "I": "i32", "stride_row": "i32"},
        {"BLOCK": 16384, "LIBDEVICE_EXP": True, "ONE_PASS": True, "PDL": True, "HW_ROUND": False},
    ),
    # silu_and_mul_fp8(form="split"): each chunk's absmax, then each chunk quantized; "stash":
    # the first launch keeps the values (bf16), the second quantizes those
    *(
        (kernel, signature, {"BLOCK": 2048, "LIBDEVICE_EXP": True, "STASH": stash} | more)
        for stash in (False, True)
        for kernel, signature, more in (
            (fp8_silu_split._silu_absmax_kernel, SPLIT_IN, {}),
            (
                fp8_silu_split._silu_quantize_kernel,
                {**SPLIT_IN, **FP8_OUT, "parts": "i32"},
                {"CHUNKS": 8, "PDL": True, "HW_ROUND": False},
            ),
        )
    ),
    (  # silu_and_mul_fp8(form="rows_fast"): a row a program, held in registers
        fp8_silu_rows._silu_rows_kernel,
        {"gate_up_ptr": "*bf16", **FP8_OUT, "I": "i32", "stride_row": "i32"},
        {"BLOCK": 16384, "PDL": True, "HW_ROUND": False},
    ),
]


def compile_ptx(fn, signature: dict, constexprs: dict) -> str:
    signature = signature | {name: "constexpr" for name in constexprs}
    source = ASTSource(fn, signature, constexprs=constexprs)
    block = constexprs.get("BLOCK", constexprs.get("BLOCK_H"))
    warps = min(16, max(4, block // 512)) if constexprs.get("ONE_PASS") else 4
    if fn is fp8_silu_rows._silu_rows_kernel:
        warps = fp8_silu_rows.ROWS_WARPS
    target = GPUTarget("cuda", 90, 32)
    return triton.compile(source, target=target, options={"num_warps": warps}).asm["ptx"]


def instructions(ptx: str) -> int:
    """PTX instruction lines (those ending in ';' that are not declarations)."""
    lines = (line.strip() for line in ptx.splitlines())
    return sum(1 for line in lines if line.endswith(";") and not line.startswith((".", "//")))


def main() -> None:
    for fn, signature, constexprs in KERNELS:
        ptx = compile_ptx(fn, signature, constexprs)
        cvt = "yes" if "cvt.rn.satfinite.e4m3x2.f32" in ptx else "no"
        # PDL True: the kernel lets a GEMM launched with PDL start (bulkgen/model/pdl.py).
        trigger = "yes" if "griddepcontrol.launch_dependents" in ptx else "no"
        line = f"{fn.__name__}: {len(ptx)} chars of PTX, cvt to e4m3: {cvt}, pdl trigger: {trigger}"
        if "HW_ROUND" in constexprs:  # fp8_kernels.HW_ROUNDING: the rounding left to the cast
            hw = compile_ptx(fn, signature, {**constexprs, "HW_ROUND": True})
            line += f", instructions {instructions(ptx)} ({instructions(hw)} with HW_ROUND)"
        print(line)


if __name__ == "__main__":
    main()
