"""An fp8 cache's first block held at about 16-bit precision: a partner block for the low part.

Later queries lean on a sequence's first tokens (attention sinks; IntactKV keeps them at full
precision), and e4m3's 3-bit mantissa on those keys is what costs the FP8 cache most accuracy
(README, FP8 KV cache). So each sequence's first block gets a partner block of the same pool,
which stores what the first one's e4m3 values leave out: a value x (in scale units, as the
cache stores it) is kept as hi = e4m3(x) in the block and lo = e4m3((x - hi) / LO_SCALE) in
its partner, and read back as hi + lo * LO_SCALE. |x - hi| is at most half of hi's last place,
1/16 of |hi|, so lo spans the same range as x and the pair keeps about 8 significant bits,
bf16's. Off unless asked for (--fp8-kv-pair-first-block): on the demo model's short texts
(58 tokens on average, so the first block is nearly all of each) it took FP8 KV-only top-1
agreement with bf16 from 0.949 to 0.982 (scripts/accuracy_kv_schemes.py, CPU emulation), but
over documents of 960 tokens from 0.953 to 0.955 (--fp8-accuracy-set long), and it cost 7% of
the 1,000/1,000 FP8 benchmark's throughput on one H200 (README, FP8 KV cache).

Which block is whose partner: engine/blocks.py (pair_first; the partner belongs to the block,
shared with it through the prefix cache), copied to a device table indexed by block id
(engine/tables.py, AttnMetadata.kv_partners: -1 where a block has none). The writes store lo at
the partner whenever a token's block has one (triton_kv_write.write_token, torch_backend's
write_kv); the attention kernels add it to the tiles of positions below block_size
(triton_kv.load_low_k / load_low_v), the torch backends to every block that has a partner.
"""

from __future__ import annotations

import torch

from bulkgen.model.attention.kv_fp8 import FP8_DTYPE, FP8_MAX

LO_SCALE = 1.0 / 16  # a power of two: the split and the join are exact in float32


def resolve_pair_first(flag: bool | None, kv_cache_dtype: str) -> bool:
    """Whether the engine pairs first blocks: only when asked for (None: not); asking for it
    with another cache than fp8 is an error in one line."""
    if flag is None:
        return False
    if flag and kv_cache_dtype != "fp8":
        raise ValueError(
            "fp8_kv_pair_first_block (--fp8-kv-pair-first-block) keeps an fp8 cache's first "
            f"block at 16-bit precision, and this run's cache is {kv_cache_dtype!r}: use "
            "--kv-cache-dtype fp8 or leave the option unset"
        )
    return bool(flag)


def low_part(x: torch.Tensor, hi: torch.Tensor, scale: float) -> torch.Tensor:
    """The e4m3 low part of x stored with this scale, whose high part is hi (e4m3, what
    kv_fp8.quantize stores: x / scale saturated, then rounded)."""
    scaled = (x.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX)
    return ((scaled - hi.float()) * (1.0 / LO_SCALE)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def join(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The float32 value (in scale units) a pair stands for."""
    return hi.float() + lo.float() * LO_SCALE
