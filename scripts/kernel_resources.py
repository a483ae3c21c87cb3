"""Registers, spills, shared memory and the occupancy they allow, of the decode kernel's launches
(bf16, fp8 and int8 caches) and silu_and_mul_fp8's kernels, compiled for sm_90 without a GPU
(Triton's bundled ptxas).

    PYTHONPATH=. python scripts/kernel_resources.py [--register-bounds 96,88]

Decode is compiled as the JIT specializes it (compile_check_attention.decode_source). One line per
variant; "CTAs/SM" is the bound from registers (65,536 a SM) and shared memory (228 KB), at most
16: a memory-bound kernel needs enough bytes in flight per SM, and fewer CTAs hold fewer.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from compile_check_attention import TARGET, decode_source
from fp8_compile_check import KERNELS
from triton.compiler import ASTSource

from bulkgen.model.attention import triton_decode

# Triton 3.x ships ptxas (CUDA 12.9, older than the PTX it now emits) and ptxas-blackwell (13.x).
PTXAS_NAMES = ("ptxas-blackwell", "ptxas")


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers a thread, spill-store bytes) that ptxas reports for sm_90a."""
    folder = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        for name in PTXAS_NAMES:
            cmd = [os.path.join(folder, name), "-v", "-arch=sm_90a", f.name, "-o", os.devnull]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0:
                text = done.stdout + done.stderr
                regs = int(re.search(r"Used (\d+) registers", text).group(1))
                return regs, int(re.search(r"(\d+) bytes spill stores", text).group(1))
        raise RuntimeError(f"no ptxas accepted the PTX: {done.stderr[-300:]}")
    finally:
        os.unlink(f.name)


def line(name: str, compiled, threads: int) -> str:
    regs, spills = ptxas_usage(compiled.asm["ptx"])
    smem = compiled.metadata.shared
    ctas = min(65536 // (regs * threads), 228 * 1024 // max(smem, 1), 16)
    return f"{name}: {regs} registers, {spills} B spilled, {smem} B shared, CTAs/SM <= {ctas}"


def bounded_lines(bounds: list[int]) -> list[str]:
    """The fp8 cache's engine launch above 256 rows (values slots inner, 128-token tiles, 2
    stages, block ids prefetched) unbounded and at each register bound (maxnreg)."""
    lines = []
    for bound in [None, *bounds]:
        source = decode_source("fp8", v_slots_inner=True, prefetch_blocks=True, block_n=128)
        options = {"num_warps": 4, "num_stages": 2} | ({"maxnreg": bound} if bound else {})
        compiled = triton.compile(source, target=TARGET, options=options)
        lines.append(line(f"decode fp8 prefetch block_n=128 stages=2 maxnreg={bound}", compiled,
                          128))  # fmt: skip
    return lines


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--register-bounds":
        print("\n".join(bounded_lines([int(b) for b in sys.argv[2].split(",")])))
        return
    for cache in ("bf16", "fp8", "int8"):
        variants = {  # (v_in_registers, v_slots_inner)
            "bf16": ((False, False),),
            "fp8": ((False, False), (True, False), (False, True)),
            "int8": ((False, False), (True, False), (False, True)),
        }[cache]
        for v_in_registers, v_slots_inner in variants:
            for block_n in (64, 128):
                for stages in (2, 3):
                    src = decode_source(cache, v_in_registers, v_slots_inner)
                    names = list(src.signature)
                    consts = {
                        names[k[0]] if isinstance(k, tuple) else k: v
                        for k, v in src.constants.items()
                    }
                    source = ASTSource(
                        triton_decode._decode_split_kernel,
                        src.signature,
                        constexprs={**consts, "BLOCK_N": block_n},
                        attrs=src.attrs,
                    )
                    options = {"num_warps": 4, "num_stages": stages}
                    compiled = triton.compile(source, target=TARGET, options=options)
                    name = f"decode {cache} v_in_registers={v_in_registers} "
                    name += f"v_slots_inner={v_slots_inner} block_n={block_n}"
                    print(line(f"{name} stages={stages}", compiled, 128), flush=True)
    for fn, signature, constexprs in KERNELS:
        if fn.__name__ != "_silu_and_mul_fp8_kernel":
            continue
        warps = 16 if constexprs.get("ONE_PASS") else 4
        source = ASTSource(fn, signature | {n: "constexpr" for n in constexprs}, constexprs)
        compiled = triton.compile(source, target=TARGET, options={"num_warps": warps})
        name = f"silu_and_mul_fp8 one_pass={constexprs.get('ONE_PASS')}"
        print(line(name, compiled, 32 * warps), flush=True)


if __name__ == "__main__":
    main()
