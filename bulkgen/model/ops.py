"""The model's elementwise ops: plain torch (CPU, and the reference) or fused Triton kernels.

On CUDA each op is one kernel from bulkgen.model.fused instead of the several small kernels
torch launches for it; a decode step of an 8B model has hundreds of them, and their launch and
memory round trips cost as much as a third of the step. Both sets compute the same function.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 and scale in the input dtype, as the reference implementation does.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum in residual_out when given."""
    residual = x + residual if residual_out is None else torch.add(x, residual, out=residual_out)
    return rms_norm(residual, weight, eps), residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gate_up_silu(gate_up_proj, x: torch.Tensor, silu_and_mul=silu_and_mul) -> torch.Tensor:
    """The MLP's first half, silu_and_mul(gate_up_proj(x)): two ops here; the FP8 ops may run
    it as one GEMM (fp8_gemm_silu.gate_up_silu)."""
    return silu_and_mul(gate_up_proj(x))


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    c = cos[positions].unsqueeze(1).to(q.dtype)  # [T, 1, D/2]
    s = sin[positions].unsqueeze(1).to(q.dtype)
    return _rotate(q, c, s), _rotate(k, c, s)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


TORCH_OPS = SimpleNamespace(
    rms_norm=rms_norm,
    add_rms_norm=add_rms_norm,
    silu_and_mul=silu_and_mul,
    gate_up_silu=gate_up_silu,
    rotary=rotary,
)


def get_ops(device: torch.device) -> SimpleNamespace:
    if device.type != "cuda":
        return TORCH_OPS
    from bulkgen.model import fused
    from bulkgen.model.fused_rotary import rotary as fused_rotary

    return SimpleNamespace(
        rms_norm=fused.rms_norm,
        add_rms_norm=fused.add_rms_norm,
        silu_and_mul=fused.silu_and_mul,
        gate_up_silu=functools.partial(gate_up_silu, silu_and_mul=fused.silu_and_mul),
        rotary=fused_rotary,
    )
