"""The int8 KV cache: int8 values with one float32 scale per (token, kv head), and its arithmetic.

`kv_cache_dtype="int8"` stores each token's key (and value) row of a kv head, x [head_dim], as
q = round_half_even(x / s) in [-127, 127] with s = max|x| / 127 (a zero row: s = 1, q = 0), and
reads it back as q * s. Keys and values have their own scales. Per element the error is at most
s / 2 = max|x| / 254: unlike FP8 e4m3 (3 mantissa bits, one scale per layer), small entries of a
row keep the row's absolute precision, which is what the keys' dot products need (on the demo
model a CPU study measured top-1 agreement 0.983 with a bf16 cache, against e4m3's 0.960:
scripts/accuracy_kv_schemes.py). Bytes a token: head_dim + 4 per (kv head, K or V), about half of
bf16's. Nothing here needs special hardware: it runs on the CPU (torch backend) and on any GPU.

The scales live beside the values: [num_layers, 2, num_blocks, block_size, num_kv_heads] float32
(allocate_kv_scales), each layer's (k_scales, v_scales) views [num_blocks, block_size, Hkv] passed
to the backends where an fp8 cache passes its float per-layer scales. The Triton write kernel and
both attention kernels compute exactly what quantize/dequantize do here.
"""

from __future__ import annotations

import torch

INT8_DTYPE = torch.int8
INT8_MAX = 127.0


def is_int8(cache: torch.Tensor) -> bool:
    return cache.dtype == INT8_DTYPE


def scale_bytes_per_token(num_layers: int, num_kv_heads: int) -> int:
    """Bytes of scales a cached token needs: one float32 per layer, K or V, and kv head."""
    return 2 * num_layers * num_kv_heads * 4


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scales) of x [..., head_dim]: a scale per row over the last dim."""
    x = x.float()
    amax = x.abs().amax(dim=-1)
    # A zero row gets scale 1 (values 0) rather than a division by zero. Divided by a tensor,
    # not the number 127: torch on CUDA multiplies by a number's float32 reciprocal instead
    # (BinaryDivTrueKernel.cu), 1 ulp off for ~5% of bf16 rows, where the CPU and the kernels
    # divide exactly.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, INT8_MAX), torch.ones_like(amax))
    # Dividing (not multiplying by a reciprocal): the kernels divide too, so the values match
    # bit for bit; |x / scale| <= 127 by construction, the clamp only guards rounding at 127.
    q = torch.round(x / scale[..., None]).clamp(-INT8_MAX, INT8_MAX).to(INT8_DTYPE)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 values of int8 rows q [..., head_dim] with their scales [...]."""
    return q.float() * scale[..., None]


def allocate_kv_scales(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, device: torch.device
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(scales storage [num_layers, 2, num_blocks, block_size, Hkv] float32, per-layer
    (k_scales, v_scales) views). Zeroed, so unwritten slots read back as finite zeros."""
    storage = torch.zeros(
        (num_layers, 2, num_blocks, block_size, num_kv_heads), dtype=torch.float32, device=device
    )
    return storage, [(layer[0], layer[1]) for layer in storage]
