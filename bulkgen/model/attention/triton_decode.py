"""Paged decode attention in Triton: GQA-grouped, split-KV (flash-decoding), CUDA-graph safe.

Every sequence has one query row (row b of q belongs to sequence b). Decode reads the whole KV
cache once per step and does little arithmetic per byte, so the kernel is built around reading
each K/V element once and keeping enough CTAs busy:

- _decode_split_kernel (triton_decode_kernel.py), grid (B, Hkv, S). Program (b, h, s) loads
  the GROUP query heads that share kv-head h as one [GROUP_PAD, D] tile, so each K/V tile is
  fetched once for the whole group, and runs an online softmax (base 2) over split s of sequence
  b's context: the context is cut into S equal runs of whole BLOCK_N tiles, sized from
  seq_lens[b] read on the device. Splits past the end of a short sequence write a neutral
  partial (lse = -inf, out = 0). With S == 1 the program writes the final output directly and
  no reduction runs.
- decode_merge.merge_splits, grid (B, Hq): merges the S normalised partials of each query head
  by their log-sum-exps.

S is chosen from the batch size, kv-head count and block-table width (all static shapes), never
from the lengths of this step, so the grid and every argument stay the same from one step to the
next and the launches can be captured in a CUDA graph and replayed after seq_lens and
block_tables change in place.

An fp8 cache (KV_FP8) is cast as each tile is loaded; its layer scales are folded out of the
loop (k_scale into qk_scale, v_scale into the final normalisation). With a bf16 or fp16 query
(DOT_F16) both products run on fp16 operands: e4m3 -> fp16 is one conversion per two values (bf16
takes more), the query is scaled by qk_scale before its one rounding to fp16 (so no score
multiply in the loop, and no overflow for any |q| below 65504 / qk_scale), and an fp8 cache's
tiles are twice as many tokens (decode_launch) so that each step of the loop reads as many
bytes as a bf16 tile: at the same tokens per tile the fp8 kernel was latency-bound, as slow as
bf16 at half the bytes (H200, bulk run profile at ec92f71: 12.1 vs 12.2 ms of attention a step).
An int8 cache (KV_INT8) is read as in triton_prefill.py, on fp16 operands (widened in PTX where
INT8_ASM), with its own measured launches.
Values may be stored slots inner (kv_layout.py, V_SLOTS_INNER: V's strides are arguments of
their own), which keeps an fp8 V tile out of byte-wise shared-memory reads without
v_in_registers. PAIRS: the first block's tiles add its partner's low parts (kv_pairs.py).
PREFETCH_BLOCKS (DecodeLaunch.prefetch_blocks) loads each tile's block ids one iteration ahead, so
that its K and V addresses come from the loop's carried values, not a load in the same iteration:
at 32 rows x 2K the loop is latency-bound (fp8 0.054 ms over 8 tiles a program, bf16 0.085 over
16: 5-7 us a tile, far above its bytes at the HBM's rate). Which is faster is measured.
"""

from __future__ import annotations

import torch
import triton

from bulkgen.model.attention.decode_merge import merge_splits, merge_splits_to_fp8
from bulkgen.model.attention.decode_mma import mma_fp8
from bulkgen.model.attention.decode_rotary import Unrotated, rotation_args, round_in_ptx
from bulkgen.model.attention.decode_tiling import DecodeLaunch, decode_launch, num_kv_splits
from bulkgen.model.attention.kv_fp8 import is_fp8
from bulkgen.model.attention.kv_layout import v_slots_inner
from bulkgen.model.attention.triton_decode_kernel import _decode_split_kernel
from bulkgen.model.attention.triton_kv import check_cache, int8_asm, int8_scale_args, output_for
from bulkgen.model.attention.triton_kv_pairs import pairs_registers
from bulkgen.model.fp8 import Fp8Activation
from bulkgen.model.fp8_kernels import hw_rounding

LOG2E = 1.4426950408889634


def launch_registers(launch: DecodeLaunch, pairs: bool, device: torch.device) -> dict:
    """The launch's register bound (maxnreg; the tighter of the launch's own and a pairs
    launch's), none on the interpreter, which has no registers."""
    bound = pairs_registers(pairs, launch.num_warps, device).get("maxnreg")
    if launch.max_registers and device.type == "cuda":
        bound = min(launch.max_registers, bound or launch.max_registers)
    return {"maxnreg": bound} if bound else {}


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    launch: DecodeLaunch | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    out: torch.Tensor | None = None,
    partners: torch.Tensor | None = None,
    fp8_rows: bool = False,
    rotate: Unrotated | None = None,
) -> torch.Tensor | Fp8Activation:
    """Attention of one query row per sequence, q [B, Hq, D], over its cached context.

    num_splits and launch override the tuned choices (for benchmarks); k_scale/v_scale
    dequantize an fp8 cache (floats) or an int8 one (scale tensors); out: where to write;
    partners: an fp8 cache's first-block partners (kv_pairs.py). fp8_rows: where the context
    is split, the merge writes FP8 rows [B, Hq * D] for an FP8 o_proj instead (an Fp8Activation,
    decode_merge.merge_splits_to_fp8); unsplit, the output as always. rotate: q is unrotated,
    and the launch rotates it and writes the step's keys and values (decode_rotary.py; an fp8,
    16-bit or float32 cache without partners)."""
    batch, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    check_cache(k_cache, v_cache, head_dim)
    assert num_q_heads % num_kv_heads == 0 and seq_lens.shape[0] == batch
    group = num_q_heads // num_kv_heads
    fp8 = is_fp8(k_cache)
    scale_args, int8 = int8_scale_args(k_cache, v_cache, k_scale, v_scale)
    # A 16-bit cache takes the launches tuned for the model's dtype ("auto"), a float32 one none.
    kind = "int8" if int8 else "fp8" if fp8 else "auto" if k_cache.element_size() == 2 else "-"
    launch = launch or decode_launch(head_dim, fp8 or int8, batch, kind)
    block_n = launch.block_n
    if num_splits is None and launch.splits is not None:
        num_splits = launch.splits  # measured for this batch (decode_tilings.json)
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        num_splits = num_kv_splits(batch, num_kv_heads, max_context, block_n, q.device)
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = output_for(out, q)
    pairs = partners is not None and fp8
    assert rotate is None or not (int8 or pairs), "decode_rotary.defers: neither"
    mma = mma_fp8(q, v_cache, block_n, pairs)
    if batch == 0:
        return out
    # Allocated per call: inside a CUDA graph they come from the graph's private pool.
    part_shape = (batch, num_q_heads, num_splits)
    part_out = torch.empty((*part_shape, head_dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty(part_shape, dtype=torch.float32, device=q.device)
    grid = (batch, num_kv_heads, num_splits)
    if launch.heads_first:
        grid = (num_kv_heads, batch, num_splits)
    _decode_split_kernel[grid](
        q,
        k_cache,
        v_cache,
        seq_lens,
        block_tables,
        out,
        part_out,
        part_lse,
        scale * LOG2E * (k_scale if fp8 else 1.0),
        v_scale if fp8 else 1.0,
        *scale_args,
        seq_lens if partners is None else partners,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        *v_cache.stride(),
        *rotation_args(rotate, q, k_scale, v_scale),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),  # tl.dot needs at least 16 rows
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_FP8=fp8,
        KV_INT8=int8,
        V_SLOTS_INNER=v_slots_inner(v_cache),
        DOT_F16=(fp8 or int8) and q.dtype != torch.float32,
        V_IN_REGISTERS=(fp8 or int8) and launch.v_in_registers,
        PREFETCH_BLOCKS=launch.prefetch_blocks,
        PAIRS=pairs,
        INT8_ASM=int8 and int8_asm(q.device),
        MMA_FP8=mma,
        ROUND_MMA=mma and not hw_rounding(q.device),
        ROTATE=rotate is not None,
        ROUND_PTX=rotate is not None and round_in_ptx(q.device),
        HEADS_FIRST=launch.heads_first,
        num_warps=launch.num_warps,
        **({"num_stages": launch.num_stages} if launch.num_stages else {}),
        **launch_registers(launch, pairs, q.device),
    )
    if num_splits > 1 and fp8_rows:
        return Fp8Activation(*merge_splits_to_fp8(part_out, part_lse, q.dtype))
    if num_splits > 1:
        merge_splits(part_out, part_lse, out)
    return out
