"""Compile the KV-write and paged attention kernels for sm_90 without a GPU: bf16, fp8, int8 caches.

    PYTHONPATH=. python scripts/compile_check_attention.py

The CPU interpreter never meets the GPU compiler: this catches what only codegen rejects (a
constant that is not tl.constexpr, an fp8 cast the target lacks). For each kernel and cache it
prints the PTX size, its fp8 conversions (cvt ... e4m3: an fp8 variant must have them, a bf16
one not) and tensor-core products on e4m3 operands ("prefill-pvfp8", kv_fp8.FP8_PV), its
loops (backward branches: the batch-invariant prefill, "invariant", streams K/V in one) and its
byte-wise shared-memory reads (`ld.shared.b8`, `.s8`: "decode-vreg", DecodeLaunch.v_in_registers,
must have none). For the int8 write kernel: its round-half-even pairs (y + 1.5 * 2**23) - 1.5 *
2**23 kept as two adds, and approximate divisions (div.approx, div.full, rcp.approx), of which
it must have none. The attention kernels are compiled as the JIT specializes them at run time:
pointers and the q, cache and scale strides divisible by 16 (not the block table's); without
that, prefill's loads compiled byte-wise without cp.async (4,251 bf16 instructions, not 2,309).
int8's scale pointers and strides are passed to every launch (dummies elsewhere):
"instructions" leaves out the parameter declarations. int8 has no slots-inner variants.
"""

from __future__ import annotations

import functools
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bulkgen.model.attention import triton_decode, triton_kv_write, triton_prefill

TARGET = GPUTarget("cuda", 90, 32)
# The Llama-3-8B shape: head_dim 128, 16-token blocks, 4 query heads per kv-head.
HEAD_DIM, BLOCK_SIZE, GROUP = 128, 16, 4
CACHE = {"bf16": "*bf16", "fp8": "*fp8e4nv", "int8": "*i8"}
SCALES = {
    "k_scales_ptr": "*fp32",
    "v_scales_ptr": "*fp32",
    "stride_scale_block": "i32",
    "stride_scale_slot": "i32",
}
# Kernels that never run over an int8 cache: its values are stored in rows (kv_layout.py).
ROWS_ONLY = ("write_kv-vslots", "decode-vslots", "prefill-vslots")
# Experiments of the fp8 cache's launches: block ids ahead (triton_decode.py), P @ V in e4m3.
FP8_ONLY = ("decode-prefetch", "prefill-pvfp8")


def _scalars(names: str, kind: str) -> dict[str, str]:
    return {name: kind for name in names.split()}


V_STRIDES = "stride_v_block stride_v_slot stride_v_head stride_v_dim"


def _v_strides(slots_inner: bool) -> tuple[dict[str, str], dict[str, int]]:
    """V's stride arguments as the JIT specializes them: the one equal to 1 (head_dim's in the
    rows layout, the slot's in the slots-inner one: kv_layout.py) becomes a constant."""
    unit = "stride_v_slot" if slots_inner else "stride_v_dim"
    return {n: "constexpr" if n == unit else "i32" for n in V_STRIDES.split()}, {unit: 1}


def _aligned(signature: dict[str, str]) -> dict:
    """Divisibility by 16 where the JIT finds it at run time: the pointers and the q and cache
    strides (the block-table stride is the table's width, which need not be)."""
    names = list(signature)
    strided = ("stride_q", "stride_cache", "stride_v", "stride_scale")
    aligned = [
        n
        for n in names
        if n.endswith("_ptr") or n.startswith(strided) and signature[n] != "constexpr"
    ]
    return {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}


def write_kv_source(cache: str, v_slots_inner: bool = False) -> ASTSource:
    v_signature, v_constants = _v_strides(v_slots_inner)
    signature = {
        **_scalars("k_ptr v_ptr", "*bf16"),
        **_scalars("k_cache_ptr v_cache_ptr", CACHE[cache]),
        "slot_ptr": "*i64",
        **_scalars(
            "stride_kt stride_kh stride_vt stride_vh stride_cache_block stride_cache_slot "
            "stride_cache_head",
            "i32",
        ),
        **v_signature,
        "num_kv_heads": "i32",
        **_scalars("k_inv_scale v_inv_scale", "fp32"),
        **SCALES,
        **_scalars("BLOCK_SIZE HEADS_PAD HEAD_DIM QUANTIZE KV_INT8", "constexpr"),
    }
    constexprs = {
        "BLOCK_SIZE": BLOCK_SIZE,
        "HEADS_PAD": 8,
        "HEAD_DIM": HEAD_DIM,
        "QUANTIZE": cache == "fp8",
        "KV_INT8": cache == "int8",
        **v_constants,
    }
    return ASTSource(triton_kv_write._write_kv_kernel, signature, constexprs=constexprs)


def decode_source(
    cache: str,
    v_in_registers: bool = False,
    v_slots_inner: bool = False,
    prefetch_blocks: bool = False,
) -> ASTSource:
    v_signature, v_constants = _v_strides(v_slots_inner)
    signature = {
        "q_ptr": "*bf16",
        **_scalars("k_cache_ptr v_cache_ptr", CACHE[cache]),
        **_scalars("seq_lens_ptr block_tables_ptr", "*i32"),
        "out_ptr": "*bf16",
        **_scalars("part_out_ptr part_lse_ptr", "*fp32"),
        **_scalars("qk_scale v_scale", "fp32"),
        **SCALES,
        **_scalars(
            "stride_qt stride_qh stride_bt stride_cache_block stride_cache_slot stride_cache_head",
            "i32",
        ),
        **v_signature,
        **_scalars(
            "GROUP GROUP_PAD HEAD_DIM BLOCK_SIZE BLOCK_N DOT_PRECISION KV_FP8 KV_INT8 DOT_F16 "
            "V_IN_REGISTERS V_SLOTS_INNER PREFETCH_BLOCKS",
            "constexpr",
        ),
    }
    eight_bit = cache in ("fp8", "int8")
    constexprs = {
        "GROUP": GROUP,
        "GROUP_PAD": 16,
        "HEAD_DIM": HEAD_DIM,
        "BLOCK_SIZE": BLOCK_SIZE,
        "BLOCK_N": triton_decode.decode_launch(HEAD_DIM, eight_bit).block_n,
        "DOT_PRECISION": "tf32",
        "KV_FP8": cache == "fp8",
        "KV_INT8": cache == "int8",
        "DOT_F16": eight_bit,
        "V_IN_REGISTERS": eight_bit and v_in_registers,
        "V_SLOTS_INNER": v_slots_inner,
        "PREFETCH_BLOCKS": prefetch_blocks,
        **v_constants,
    }
    attrs = _aligned(signature)
    return ASTSource(
        triton_decode._decode_split_kernel, signature, constexprs=constexprs, attrs=attrs
    )


def decode_prefetch_source(cache: str) -> ASTSource:
    """The engine's fp8 layout (values slots inner) with each tile's block ids loaded ahead."""
    return decode_source(cache, v_slots_inner=True, prefetch_blocks=True)


def prefill_source(
    cache: str, invariant: bool = False, v_slots_inner: bool = False, pv_fp8: bool = False
) -> ASTSource:
    v_signature, v_constants = _v_strides(v_slots_inner)
    if invariant:  # the batch-invariant backend's one tiling (triton_invariant.py)
        block_q, block_m, block_n = triton_prefill.invariant_tiles(GROUP, HEAD_DIM)
    else:
        block_q, block_m, block_n = triton_prefill.prefill_tiles(2048, GROUP, HEAD_DIM)
    signature = {
        "q_ptr": "*bf16",
        **_scalars("k_cache_ptr v_cache_ptr", CACHE[cache]),
        **_scalars("query_start_loc_ptr seq_lens_ptr block_tables_ptr", "*i32"),
        "out_ptr": "*bf16",
        "num_seqs": "i32",
        **_scalars("qk_scale v_scale", "fp32"),
        **SCALES,
        **_scalars(
            "stride_qt stride_qh stride_bt stride_cache_block stride_cache_slot stride_cache_head",
            "i32",
        ),
        **v_signature,
        **_scalars(
            "GROUP HEAD_DIM BLOCK_SIZE BLOCK_Q BLOCK_M BLOCK_N DOT_PRECISION KV_FP8 KV_INT8 "
            "V_SLOTS_INNER INVARIANT DOT_F16 PV_FP8 ROUND_P",
            "constexpr",
        ),
    }
    constexprs = {
        "GROUP": GROUP,
        "HEAD_DIM": HEAD_DIM,
        "BLOCK_SIZE": BLOCK_SIZE,
        "BLOCK_Q": block_q,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "DOT_PRECISION": "tf32",
        "KV_FP8": cache == "fp8",
        "KV_INT8": cache == "int8",
        "V_SLOTS_INNER": v_slots_inner,
        "INVARIANT": invariant,
        "DOT_F16": cache != "bf16" and triton_prefill.F16_PRODUCTS,  # as paged_prefill
        "PV_FP8": pv_fp8,
        "ROUND_P": False,  # the cast rounds on a GPU (fp8_kernels.hw_rounding)
        **v_constants,
    }
    return ASTSource(
        triton_prefill._prefill_kernel, signature, constexprs=constexprs, attrs=_aligned(signature)
    )


def invariant_source(cache: str) -> ASTSource:
    return prefill_source(cache, invariant=True)


SOURCES = {
    "write_kv": write_kv_source,
    "write_kv-vslots": functools.partial(write_kv_source, v_slots_inner=True),
    "decode": decode_source,
    "decode-vreg": functools.partial(decode_source, v_in_registers=True),
    "decode-vslots": functools.partial(decode_source, v_slots_inner=True),
    "decode-prefetch": decode_prefetch_source,
    "prefill": prefill_source,
    "prefill-vslots": functools.partial(prefill_source, v_slots_inner=True),
    "prefill-pvfp8": functools.partial(prefill_source, v_slots_inner=True, pv_fp8=True),
    "invariant": invariant_source,
}


def compile_ptx(kernel: str, cache: str) -> str:
    """The sm_90 PTX of one kernel for one cache dtype ("bf16", "fp8" or "int8")."""
    compiled = triton.compile(SOURCES[kernel](cache), target=TARGET, options={"num_warps": 4})
    return compiled.asm["ptx"]


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


def main() -> None:
    for kernel in SOURCES:
        for cache in CACHE:
            if cache == "int8" and kernel in ROWS_ONLY or cache != "fp8" and kernel in FP8_ONLY:
                continue
            ptx = compile_ptx(kernel, cache)
            print(f"{kernel:15s} {cache:4s}: {len(ptx):7d} chars of PTX, "
                  f"{instructions(ptx)} instructions, {loops(ptx)} loops, "
                  f"{round_half_even_pairs(ptx)} round-half-even pairs, "
                  f"{approximate_divisions(ptx)} approximate divisions, "
                  f"copy waits {copy_waits(ptx)}, "
                  f"{shared_byte_reads(ptx)} shared byte reads, "
                  f"{fp8_products(ptx)} e4m3 products, "
                  f"{fp8_conversions(ptx)} e4m3 conversions")  # fmt: skip


if __name__ == "__main__":
    main()
