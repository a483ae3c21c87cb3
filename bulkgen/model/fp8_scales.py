"""A checkpoint's FP8 scales as they load (fp8_checkpoint.py): checked (the shapes a scale may
take; values finite and positive: a NaN, infinite or negative scale loaded silently and made a
GPU's outputs NaN or zero, where the KV-cache scales were already refused), and block-wise
scales turned into per-row ones."""

from __future__ import annotations

import torch

from bulkgen.model.fp8 import quantize_weight


def check_scale(
    tensor: torch.Tensor, name: str, shapes: tuple | None, kind: str, zero_ok: bool
) -> None:
    """A checkpoint scale of one of `shapes` (None: its shape checked already), finite and
    positive (or zero where zero_ok: a weight scale of zero dequantizes to zeros), else a
    ValueError naming it (a host read, once at load, as for the KV-cache scales)."""
    if shapes is not None and tuple(tensor.shape) not in shapes:
        raise ValueError(
            f"scale {name!r} is {list(tensor.shape)} in the checkpoint; a {kind} scale is one of "
            f"{[list(s) for s in shapes]}"
        )
    t = tensor.float()
    bad = ~torch.isfinite(t) | (t < 0) if zero_ok else ~(torch.isfinite(t) & (t > 0))
    if bool(bad.any()):
        raise ValueError(
            f"scale {name!r} must be finite and {'>= 0' if zero_ok else 'positive'}; the "
            f"checkpoint has {t[bad].reshape(-1)[:4].tolist()}"
        )


def dequantize_blocks(
    weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int], module: str
) -> torch.Tensor:
    """An FP8 weight [N, K] with a scale per block [ceil(N / rows), ceil(K / cols)] (the last
    blocks may be partial) as float32."""
    rows, cols = block
    n, k = weight.shape
    grid = (-(-n // rows), -(-k // cols))
    if tuple(scales.shape) != grid:
        raise ValueError(
            f"{module}: block scales of shape {list(scales.shape)} for a [{n}, {k}] weight in "
            f"{rows}x{cols} blocks (expected {list(grid)})"
        )
    check_scale(scales, f"{module} block scales", None, "block", zero_ok=True)
    full = scales.float().repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]
    return weight.float() * full


def requantize_blocks(
    weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int], module: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A block-wise FP8 weight -> (fp8 [N, K], float32 scales [N]), quantized per output row from
    its dequantized values (dequantize_blocks)."""
    return quantize_weight(dequantize_blocks(weight, scales, block, module))
