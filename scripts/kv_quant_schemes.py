"""Quantize-dequantize emulations of KV-cache storage schemes, for accuracy measurements.

Each function takes keys or values [T, Hkv, D] and returns, in float32, what a cache of that
scheme would give back when read: x -> dequantize(quantize(x)). Used by
scripts/accuracy_kv_schemes.py to compare scale schemes without touching the kernels.

- fp8_fixed: one scale per tensor (or any scale tensor broadcastable to [T, Hkv, D]), as the
  cache does today (kv_fp8.quantize: x * (1 / scale), saturated, round to nearest even).
- fp8_per_token: one float32 scale per (token, kv head), amax / max_finite, so every head
  vector uses the format's whole range (the scale stored beside the cache: 4 bytes per head).
- int8_per_token: the same with symmetric int8 (round(x / s), s = amax / 127), for comparison.
- first_kept: a quantizer for all but a sequence's first tokens, which stay bfloat16 (the
  attention sinks every later query leans on; IntactKV's idea).
- own_mean_centred: keys minus the mean of the sequence's own keys at some positions (no
  calibration file: a per-sequence offset, which the softmax cancels as it does a fixed one).
- recorder: no quantization; records the largest |x| and the sum over tokens per kv head (the
  calibration pass).
- hadamard / rotated: a normalized Hadamard rotation of the head dimension before quantizing
  (and its inverse after); q . k is unchanged when both q and k are rotated, so emulating it as
  H^T QD(H k) gives the attention the same scores the rotated cache would.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
Quantizer = Callable[[torch.Tensor], torch.Tensor]


def max_finite(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def fp8_fixed(
    x: torch.Tensor, scale: float | torch.Tensor, dtype: torch.dtype = E4M3
) -> torch.Tensor:
    """x stored as fp8(clamp(x / scale)) and read back times scale."""
    top = max_finite(dtype)
    # Multiply by the reciprocal, as kv_fp8.quantize and the write kernel do.
    return (x.float() * (1.0 / scale)).clamp(-top, top).to(dtype).float() * scale


def per_token_scale(x: torch.Tensor, top: float) -> torch.Tensor:
    """[T, Hkv, 1] float32 scales mapping each head vector's amax to `top` (1.0 for a zero
    vector, which then stores zeros)."""
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, amax / top, torch.ones_like(amax))


def fp8_per_token(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    return fp8_fixed(x, per_token_scale(x, max_finite(dtype)), dtype)


def int8_per_token(x: torch.Tensor) -> torch.Tensor:
    scale = per_token_scale(x, 127.0)
    return (x.float() / scale).round().clamp(-127, 127) * scale


def hadamard(n: int) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix divided by sqrt(n): orthogonal and symmetric
    (n a power of two)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power-of-two size, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def rotated(quantizer: Quantizer) -> Quantizer:
    """quantizer applied to x rotated by the normalized Hadamard matrix over the head
    dimension, rotated back after: H QD(H x) (H is its own inverse)."""

    def quantize(x: torch.Tensor) -> torch.Tensor:
        h = hadamard(x.shape[-1]).to(x.device)
        return quantizer(x.float() @ h) @ h

    return quantize


def first_kept(count: int, quantizer: Quantizer) -> Quantizer:
    """quantizer for rows count.. of x [T, Hkv, D], rows 0..count-1 rounded to bfloat16 only: x's
    rows are a sequence's positions from 0 (one prefill from the start)."""

    def quantize(x: torch.Tensor) -> torch.Tensor:
        out = quantizer(x)
        out[:count] = x[:count].to(torch.bfloat16).float()
        return out

    return quantize


def first_split(count: int, quantizer: Quantizer, lo_scale: float = 1.0 / 16) -> Quantizer:
    """quantizer for rows count.. of x [T, Hkv, D]; rows 0..count-1 stored as two e4m3 values,
    hi = e4m3(x) and lo = e4m3((x - hi) / lo_scale), read back as hi + lo * lo_scale (a first
    block held in two fp8 blocks of the cache: about bf16's precision at fp8's range)."""

    def quantize(x: torch.Tensor) -> torch.Tensor:
        out = quantizer(x)
        head = x[:count].float()
        hi = head.clamp(-448.0, 448.0).to(E4M3).float()
        lo = ((head - hi) * (1.0 / lo_scale)).clamp(-448.0, 448.0).to(E4M3).float()
        out[:count] = hi + lo * lo_scale
        return out

    return quantize


def own_mean_centred(quantizer: Quantizer, start: int = 16, end: int = 80) -> Quantizer:
    """quantizer applied to x [T, Hkv, D] minus the mean of its rows start..end-1 (fewer if x is
    shorter; none: no shift), added back after. One vector per sequence and kv head shifts every
    score of a query by the same amount, so a cache may store the difference; an engine would
    take the mean from the prompt's first chunk."""

    def quantize(x: torch.Tensor) -> torch.Tensor:
        rows = x[start:end].float()
        mu = rows.mean(0, keepdim=True) if len(rows) else torch.zeros_like(x[:1]).float()
        return quantizer(x.float() - mu) + mu

    return quantize


def recorder(amax: torch.Tensor, sums: torch.Tensor, layer: int, kind: int) -> Quantizer:
    """Records the largest |x| per kv head into amax [layers, 2, Hkv] and the sum over tokens
    into sums [layers, 2, Hkv, D + 1] (the last column counts the tokens)."""

    def record(x: torch.Tensor) -> torch.Tensor:
        torch.maximum(amax[layer, kind], x.float().abs().amax(dim=(0, 2)), out=amax[layer, kind])
        sums[layer, kind, :, :-1] += x.float().sum(0)
        sums[layer, kind, :, -1] += len(x)
        return x

    return record
