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
"instructions" leaves out the parameter declarations. int8 takes the slots-inner and prefetching
variants as fp8 does (its engine layout and measured launches since c23eb54 / f9515cb).
"""

from __future__ import annotations

import functools

import triton
from ptx_counts import (
    approximate_divisions,
    copy_waits,
    fp8_conversions,
    fp8_products,
    instructions,
    loops,
    round_half_even_pairs,
    shared_byte_reads,
)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bulkgen.model.attention import triton_decode, triton_kv_write, triton_prefill
from bulkgen.model.attention.triton_decode_kernel import _decode_split_kernel

TARGET = GPUTarget("cuda", 90, 32)
# The Llama-3-8B shape: head_dim 128, 16-token blocks, 4 query heads per kv-head.
HEAD_DIM, BLOCK_SIZE, GROUP = 128, 16, 4
CACHE = {"bf16": "*bf16", "fp8": "*fp8e4nv", "int8": "*i8"}
SCALES = {
    "k_scales_ptr": "*fp32",
    "v_scales_ptr": "*fp32",
    "stride_scale_block": "i32",
    "stride_scale_slot": "i32",
    "partners_ptr": "*i32",  # an fp8 cache's paired first blocks (kv_pairs.py; PAIRS)
}
# The fp8 cache's alone: P @ V in e4m3, and its paired first blocks (kv_pairs.py), in the engine's
# layout (values slots inner).
FP8_ONLY = ("prefill-pvfp8", "write_kv-pairs", "decode-pairs", "prefill-pairs", "decode-mma")
# The kernels compiled for each cache but these: block ids loaded ahead (triton_decode.py) run
# over 8-bit caches only (fp8's and int8's measured launches).
# An int8 cache's rotary stays apart (decode_rotary.py).
SKIPPED = {"bf16": (*FP8_ONLY, "decode-prefetch"), "fp8": (), "int8": (*FP8_ONLY, "decode-rotary")}


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


def write_kv_source(cache: str, v_slots_inner: bool = False, pairs: bool = False) -> ASTSource:
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
        **_scalars("BLOCK_SIZE HEADS_PAD HEAD_DIM QUANTIZE KV_INT8 PAIRS", "constexpr"),
    }
    constexprs = {
        "BLOCK_SIZE": BLOCK_SIZE,
        "HEADS_PAD": 8,
        "HEAD_DIM": HEAD_DIM,
        "QUANTIZE": cache == "fp8",
        "KV_INT8": cache == "int8",
        "PAIRS": pairs,
        **v_constants,
    }
    return ASTSource(triton_kv_write._write_kv_kernel, signature, constexprs=constexprs)


def decode_source(
    cache: str,
    v_in_registers: bool = False,
    v_slots_inner: bool = False,
    prefetch_blocks: bool = False,
    pairs: bool = False,
    mma: bool = False,
    block_n: int | None = None,
    rotate: bool = False,
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
        # ROTATE's (decode_rotary.py), in the kernel's order: passed to every launch
        **_scalars("k_new_ptr v_new_ptr", "*bf16"),
        **_scalars("stride_knt stride_knh stride_vnt stride_vnh", "i32"),
        **_scalars("positions_ptr", "*i64"),
        **_scalars("cos_ptr sin_ptr", "*fp32"),
        **_scalars("stride_cos stride_sin", "i32"),
        **_scalars("slot_ptr", "*i64"),
        **_scalars("k_inv_scale v_inv_scale", "fp32"),
        **_scalars(
            "GROUP GROUP_PAD HEAD_DIM BLOCK_SIZE BLOCK_N DOT_PRECISION KV_FP8 KV_INT8 DOT_F16 "
            "V_IN_REGISTERS V_SLOTS_INNER PREFETCH_BLOCKS PAIRS INT8_ASM MMA_FP8 ROUND_MMA "
            "ROTATE ROUND_PTX HEADS_FIRST",
            "constexpr",
        ),
    }
    eight_bit = cache in ("fp8", "int8")
    constexprs = {
        "GROUP": GROUP,
        "GROUP_PAD": 16,
        "HEAD_DIM": HEAD_DIM,
        "BLOCK_SIZE": BLOCK_SIZE,
        "BLOCK_N": block_n or triton_decode.decode_launch(HEAD_DIM, eight_bit).block_n,
        "DOT_PRECISION": "tf32",
        "KV_FP8": cache == "fp8",
        "KV_INT8": cache == "int8",
        "DOT_F16": eight_bit,
        "V_IN_REGISTERS": eight_bit and v_in_registers,
        "V_SLOTS_INNER": v_slots_inner,
        "PREFETCH_BLOCKS": prefetch_blocks,
        "PAIRS": pairs,
        "INT8_ASM": cache == "int8",  # as on a GPU (triton_kv.int8_asm)
        "MMA_FP8": mma,
        "ROUND_MMA": False,  # the GPU's cast rounds
        "ROTATE": rotate,
        "ROUND_PTX": rotate,  # as on a GPU (decode_rotary.round_in_ptx)
        "HEADS_FIRST": False,  # the same kernel body in another launch order
        **v_constants,
    }
    attrs = _aligned(signature)
    return ASTSource(_decode_split_kernel, signature, constexprs=constexprs, attrs=attrs)


def decode_prefetch_source(cache: str) -> ASTSource:
    """The engine's 8-bit layout (values slots inner) with each tile's block ids loaded ahead."""
    return decode_source(cache, v_slots_inner=True, prefetch_blocks=True)


def decode_rotary_source(cache: str) -> ASTSource:
    """The rotary and the new token's write in the launch (decode_rotary.py), in the cache's
    engine layout: an fp8 cache's values slots inner with block ids loaded ahead, bf16's rows."""
    eight_bit = cache != "bf16"
    return decode_source(cache, v_slots_inner=eight_bit, prefetch_blocks=eight_bit, rotate=True)


def prefill_source(
    cache: str,
    invariant: bool = False,
    v_slots_inner: bool = False,
    pv_fp8: bool = False,
    pairs: bool = False,
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
            "V_SLOTS_INNER INVARIANT DOT_F16 PV_FP8 ROUND_P PAIRS INT8_ASM",
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
        "PAIRS": pairs,
        "INT8_ASM": cache == "int8",  # as on a GPU (triton_kv.int8_asm)
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
    "write_kv-pairs": functools.partial(write_kv_source, v_slots_inner=True, pairs=True),
    "decode-pairs": functools.partial(decode_source, v_slots_inner=True, pairs=True),
    # decode_mma.py (BULKGEN_FP8_DECODE_MMA) at the engine's 32-row launch: 64-token tiles
    "decode-mma": functools.partial(
        decode_source, v_slots_inner=True, prefetch_blocks=True, mma=True, block_n=64
    ),
    "prefill-pairs": functools.partial(prefill_source, v_slots_inner=True, pairs=True),
    "decode-rotary": decode_rotary_source,
}


def compile_ptx(kernel: str, cache: str) -> str:
    """The sm_90 PTX of one kernel for one cache dtype ("bf16", "fp8" or "int8")."""
    compiled = triton.compile(SOURCES[kernel](cache), target=TARGET, options={"num_warps": 4})
    return compiled.asm["ptx"]


def main() -> None:
    for kernel in SOURCES:
        for cache in CACHE:
            if kernel in SKIPPED[cache]:
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
