"""Compile the fused sampler kernel for sm_90 without a GPU and count PTX instructions per loop.

    PYTHONPATH=. python scripts/compile_check.py [--dump out.ptx]

The CPU interpreter does not run the GPU compiler, so this catches frontend and codegen errors.
Each streaming pass is one PTX loop over the row; a loop's instruction count divided by the tokens
each thread handles per iteration (BLOCK / (32 * NUM_WARPS)) is its cost per token, the number
that sets a row's time once the rest of the batch has finished.
"""

from __future__ import annotations

import argparse
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bulkgen.engine import triton_sampler as ts

SIGNATURE = {
    "logits_ptr": "*fp32",
    "stride_row": "i32",
    "allowed_ptr": "*i32",
    "stride_allowed": "i32",
    "temperature_ptr": "*fp32",
    "top_k_ptr": "*i64",
    "top_p_ptr": "*fp32",
    "min_p_ptr": "*fp32",
    "seed_ptr": "*i64",
    "position_ptr": "*i64",
    "out_ptr": "*i64",
    "V": "i32",
    **{name: "constexpr" for name in ts.CONSTEXPRS},
}


def compile_ptx(has_mask: bool) -> str:
    constexprs = {"HAS_MASK": has_mask, "FAST_LOG": True}
    constexprs |= {name: getattr(ts, name) for name in ts.CONSTEXPRS if name not in constexprs}
    src = ASTSource(ts._sample_kernel, SIGNATURE, constexprs=constexprs)
    kernel = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": ts.NUM_WARPS}
    )
    return kernel.asm["ptx"]


def loops(ptx: str) -> list[tuple[str, int, int]]:
    """(header label, instructions in the body, bar.syncs) of each backward branch's loop."""
    lines = [line.strip() for line in ptx.splitlines()]
    where = {}
    found = []
    for i, line in enumerate(lines):
        if m := re.match(r"^(\$L__BB\d+_\d+):", line):
            where[m.group(1)] = i
        elif (m := re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)) and m.group(1) in where:
            body = lines[where[m.group(1)] : i + 1]
            insts = [x for x in body if x.endswith(";") and not x.startswith((".", "//"))]
            if "ret;" in insts:  # a jump back to shared exit code, not a loop
                continue
            found.append((m.group(1), len(insts), sum("bar.sync" in x for x in insts)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", help="write the PTX (no bitmask) here")
    args = parser.parse_args()
    for has_mask in (False, True):
        ptx = compile_ptx(has_mask)
        if args.dump and not has_mask:
            open(args.dump, "w").write(ptx)
        print(f"HAS_MASK={has_mask}: {len(ptx)} chars of PTX")
        for label, n, bars in loops(ptx):
            print(f"  loop {label}: {n} instructions, {bars} bar.sync")


if __name__ == "__main__":
    main()
