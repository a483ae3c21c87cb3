"""Counts over a kernel's PTX (scripts/compile_check_attention.py prints them for every
attention kernel): instructions, loops, e4m3 conversions and products, shared-memory byte
reads, the int8 write's rounding, approximate divisions, cp.async waits."""

from __future__ import annotations

import re


def fp8_conversions(ptx: str) -> int:
    """cvt instructions to or from e4m3 in the PTX."""
    return len(re.findall(r"\bcvt\.[^;]*e4m3", ptx))


def fp8_products(ptx: str) -> int:
    """Tensor-core products (mma, wgmma) on e4m3 operands."""
    return len(re.findall(r"\b(?:wg)?mma[.\w]*\.e4m3\.e4m3\b", ptx))


def instructions(ptx: str) -> int:
    """PTX instructions, without declarations (a kernel's parameter list among them)."""
    body = [line.strip() for line in ptx.splitlines()]
    return sum(1 for line in body if line.endswith(";") and not line.startswith((".", "//")))


def shared_byte_reads(ptx: str) -> int:
    """ld.shared.b8 (.s8 for int8) instructions: reads of shared memory one byte at a time."""
    return len(re.findall(r"\bld\.shared\.[bsu]8\b", ptx))


_ROUND = "0f4B400000"  # 1.5 * 2**23 as PTX writes a float32 immediate


def round_half_even_pairs(ptx: str) -> int:
    """Adds of +1.5 * 2**23 matched by an add of -1.5 * 2**23 (or a sub of +): the rounding of
    triton_kv_write._quantize_int8_rows, not folded away by the compiler."""
    up = len(re.findall(rf"\badd(?:\.rn)?\.f32\s[^;]*, {_ROUND};", ptx))
    down = len(re.findall(r"\badd(?:\.rn)?\.f32\s[^;]*, 0fCB400000;", ptx))
    down += len(re.findall(rf"\bsub(?:\.rn)?\.f32\s[^;]*, {_ROUND};", ptx))
    return min(up, down)


def approximate_divisions(ptx: str) -> int:
    """float32 divisions or reciprocals that are not IEEE-rounded (Triton's "/" on the GPU)."""
    return len(re.findall(r"\b(?:div\.(?:approx|full)|rcp\.approx)[.\w]*\.f32\b", ptx))


def copy_waits(ptx: str) -> list[int]:
    """The cp.async.wait_group counts in order: 0 waits for every copy in flight (a loop whose
    head waits with 0 keeps one tile's copies in flight, not several)."""
    return [int(n) for n in re.findall(r"\bcp\.async\.wait_group\s+(\d+)", ptx)]


def loops(ptx: str) -> int:
    """Backward branches in the PTX: one per loop the compiler kept."""
    labels, count = set(), 0
    for line in ptx.splitlines():
        if m := re.match(r"^\s*(\$L__BB\d+_\d+):", line):
            labels.add(m.group(1))
        elif (m := re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)) and m.group(1) in labels:
            count += 1
    return count
