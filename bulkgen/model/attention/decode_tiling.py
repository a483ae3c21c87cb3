"""How the split decode kernel (triton_decode.py) is launched: tokens per K/V tile, warps,
stages and where an fp8 V tile is converted (DecodeLaunch, measured per cache kind by
scripts/tune_decode.py and stored in decode_tilings.json), and how many splits each sequence's
context is cut into (num_kv_splits, from static shapes only: CUDA-graph safe)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import NamedTuple

import torch
import triton

from bulkgen.model.switches import table_file

MAX_SPLITS = 64
# Splits are added until there are about this many CTAs per SM. Measured on the H200 at the 8B
# shape (scripts/tune_decode.py): 2 beat 8 (batch 32, context 4096: 0.141 vs 0.151+ ms), and
# batches of 128+ sequences run best unsplit.
CTAS_PER_SM = 2


def decode_block_n(head_dim: int) -> int:
    """Tokens per K/V tile: 64 keeps a [64, 128] bf16 tile of K and of V in flight per stage."""
    return 64 if head_dim <= 128 else 32


class DecodeLaunch(NamedTuple):
    """Tokens per K/V tile, warps and pipeline stages (None: Triton's default) of the split
    kernel, and for an fp8 cache where its V tile becomes fp16.

    v_in_registers: Triton stages a V tile that feeds the P @ V product straight from its load in
    shared memory, and reads an 8-bit tile back for that (transposed) operand one byte per
    instruction (128 `ld.shared.b8` a thread in the sm_90 PTX); with a select between the
    conversion and the product it converts the tile in registers and stages it as fp16 (16-byte
    stores and `ldmatrix.trans`), at the cost of shared memory for the fp16 tile.
    scripts/compile_check_attention.py counts both; which is faster is measured, not assumed.
    """

    block_n: int
    num_warps: int = 4
    num_stages: int | None = None
    v_in_registers: bool = False
    # Splits per (sequence, kv head) as measured for this batch bucket; None: num_kv_splits.
    splits: int | None = None
    # Each tile's block ids loaded one iteration ahead (triton_decode.py: PREFETCH_BLOCKS).
    prefetch_blocks: bool = False
    # A bound on a thread's registers (Triton's maxnreg on CUDA; None: the compiler's own). The
    # fp8 cache's 2-stage launches of 128-token tiles take 122-124 registers, 4 CTAs an SM; at 96
    # they compile for sm_90 without spilling (ptxas; 16 B spilled at 88) and fit 5 CTAs in their
    # 41 KB of shared memory: more loads in flight, where Nsight Compute found the fp8 kernel at
    # 25% occupancy stalled on its loads (857 rows x 1,500 tokens, 0c16a4e). Whether that pays
    # is sweep_decode_large.py's to measure.
    max_registers: int | None = None
    # The grid's kv heads vary fastest (grid (Hkv, B, S) rather than (B, Hkv, S)): a sequence's
    # heads then run side by side, and the keys of a token, stored [slot, head, dim] (each head's
    # 128 bytes a token for fp8 at head_dim 128, every 1 KB at 8 heads), are read from the same
    # DRAM pages at about the same time rather than by programs a batch apart. Whether that pays
    # is sweep_decode_large.py's to measure.
    heads_first: bool = False


# scripts/tune_decode.py --kv-cache-dtype fp8 --write-table: the fastest launch for an fp8 cache
# on the H200 at the 8B attention shape, by head dim and batch size: a list of launches, each
# with the largest batch it is for ("max_batch", null for any larger one). At bd2b623 tiles of 64
# tokens won at 32 rows and of 128 at 256 and 512 (0.89-0.90 of the 64-token tiles' time there).
TILINGS_FILE = Path(__file__).with_name("decode_tilings.json")
# Another table read instead of TILINGS_FILE, for A/B runs of two tables in one call (a missing
# file is an error, not "no table"); stats.json's env_overrides names it (switches.KERNEL_SWITCHES).
TILINGS_ENV = "BULKGEN_DECODE_TILINGS"


def tilings_path() -> Path:
    """The table decode_launch reads: BULKGEN_DECODE_TILINGS's file where set, else TILINGS_FILE."""
    return table_file(TILINGS_ENV, TILINGS_FILE)


@functools.cache
def measured_table() -> dict:
    """tilings_path()'s contents ({} without TILINGS_FILE), read once."""
    path = tilings_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def measured_launches() -> dict[str, dict]:
    """{cache kind: {head dim: [launch fields with max_batch, ...]}} from TILINGS_FILE."""
    return measured_table().get("launches", {})


def fp8_v_slots_inner() -> bool:
    """Whether an fp8 cache's values are allocated slots inner (kv_layout.py): as measured by
    scripts/tune_decode.py (TILINGS_FILE's "fp8_v_layout"), rows until it is."""
    return measured_table().get("fp8_v_layout") == "slots_inner"


def launch_for_batch(entries: list[dict] | dict, batch: int | None) -> DecodeLaunch:
    """The launch of the first entry whose max_batch holds `batch` (None: the largest batch's);
    a single dict (one launch for every batch) is taken as it is."""
    if isinstance(entries, dict):
        return DecodeLaunch(**entries)
    for entry in entries:
        limit = entry.get("max_batch")
        if limit is None or (batch is not None and batch <= limit):
            break
    return DecodeLaunch(**{k: v for k, v in entry.items() if k != "max_batch"})


def decode_launch(
    head_dim: int, fp8: bool, batch: int | None = None, kind: str = "fp8"
) -> DecodeLaunch:
    """The split kernel's launch for `batch` sequences over a cache of this head dim and kind:
    a 16-bit one (fp8 False, kind "auto": the model's dtype) as measured under "auto" in
    TILINGS_FILE, else tiles of decode_block_n tokens (also for any other fp8-False kind: a
    float32 cache is never tuned); 8-bit ones (fp8 True; kind "fp8" or "int8") as measured
    (int8 its own since f9515cb, else fp8's: the same bytes a token), else twice the
    tokens (the same bytes per tile). The batch is a static shape: each CUDA graph keeps one."""
    launches = measured_launches()
    if not fp8:
        measured = launches.get("auto", {}).get(str(head_dim)) if kind == "auto" else None
        if not measured:
            return DecodeLaunch(decode_block_n(head_dim))
        return launch_for_batch(measured, batch)
    measured = launches.get(kind, {}).get(str(head_dim)) or launches.get("fp8", {}).get(
        str(head_dim)
    )
    if not measured:
        return DecodeLaunch(2 * decode_block_n(head_dim))
    return launch_for_batch(measured, batch)


def num_kv_splits(
    batch: int, num_kv_heads: int, max_context: int, block_n: int, device: torch.device
) -> int:
    """Splits per (sequence, kv-head): a function of static shapes only (CUDA-graph safe)."""
    # Host-side property, cached by torch: no device sync. The CPU interpreter gets a token 4.
    cuda = device.type == "cuda"
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
    wanted = triton.cdiv(CTAS_PER_SM * num_sms, batch * num_kv_heads)
    useful = triton.cdiv(max_context, block_n)  # more splits than tiles would all be empty
    return max(1, min(triton.next_power_of_2(wanted), triton.next_power_of_2(useful), MAX_SPLITS))
