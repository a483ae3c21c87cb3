"""FP8 linear layers: float8_e4m3fn weights with per-output-channel scales, activations quantized
per token as they arrive, and one scaled GEMM (torch._scaled_mm: cuBLASLt on CUDA).

A weight W [N, K] is stored as Wq (fp8) and s_w [N] (float32) with W ~ Wq * s_w[:, None]; an
activation row x [K] as xq (fp8) and s_x (float32) with x ~ xq * s_x. Then
x @ W.T ~ (xq @ Wq.T) * s_x * s_w, which _scaled_mm computes in one kernel from the fp8
operands (rowwise scaling: scale_a [M, 1], scale_b [1, N], bf16 out), or at few rows the
Triton kernel of fp8_gemm.py where the GPU measured it faster (fp8_gemm_table.py). Per-channel
weight scales also hold the per-tensor scales of checkpoints exactly: fused q/k/v parts each keep
their own scale, repeated over their rows.

Only the decoder's projections (qkv, o, gate_up, down) become FP8; embeddings and lm_head stay.
Everything here is shape-driven (no host reads of tensor data): the CUDA graphs capture it."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
MIN_ABSMAX = 1e-12  # an all-zero row (graph padding) gets a tiny scale, not a division by zero
# The projections that become FP8 (names in our fused layout, see loader._FUSED).
FP8_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class Fp8Activation(NamedTuple):
    """Activation rows already quantized by the kernel that produced them (fp8_fused.py)."""

    q: torch.Tensor  # [M, K] float8_e4m3fn
    scale: torch.Tensor  # [M, 1] float32


def fp8_unsupported(device: torch.device) -> str | None:
    """Why FP8 cannot run on this device, or None when it can (CUDA, compute capability 8.9+)."""
    if device.type != "cuda":
        return (
            f"FP8 needs a CUDA GPU with FP8 tensor cores (Ada or Hopper: compute capability "
            f"8.9+), not the {device.type.upper()}; drop the FP8 option or use such a GPU"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return (
            f"FP8 needs compute capability 8.9+ (Ada or Hopper); {name} has {major}.{minor}: "
            "drop the FP8 option or use such a GPU"
        )
    return None


def resolve_fast_accum(setting: bool | None, quantization: dict | None) -> bool:
    """Whether the FP8 GEMMs sum in the tensor cores' own accumulator: the setting, or by default
    (None) whenever the weights are FP8. On the H200 it made the bulk workload 5-11% faster and
    kept the demo model's top-1 agreement with bf16 (0.906 against 0.899 with exact sums)."""
    if setting and quantization is None:
        raise ValueError(
            "fp8_fast_accum (--fp8-fast-accum) sets how FP8 GEMMs sum, and this model has "
            "none: add --quantization fp8 or load an FP8 checkpoint"
        )
    return quantization is not None if setting is None else setting


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], float32 scales [N]) with w ~ q * scale[:, None], per row."""
    wf = w.float()
    scale = wf.abs().amax(dim=1).clamp(min=MIN_ABSMAX) / FP8_MAX
    return (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantize_rows_reference(
    x: torch.Tensor, static_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], float32 scales [M, 1]): each row scaled by its absmax / 448, or
    all by static_scale (a checkpoint's calibrated input scale). The Triton kernel in
    fp8_kernels.py computes the same, bit for bit."""
    xf = x.float()
    if static_scale is None:
        absmax = xf.abs().amax(dim=1, keepdim=True).clamp(min=MIN_ABSMAX)
        # Divided by a tensor, not the number: torch on CUDA divides by a scalar as a multiply by
        # its reciprocal, an ulp off IEEE division in some rows (seen on the H200).
        scale = absmax / torch.full_like(absmax, FP8_MAX)
    else:
        scale = static_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantize_rows(
    x: torch.Tensor, static_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows_reference, as one Triton kernel on CUDA."""
    if x.is_cuda:
        from bulkgen.model.fp8_kernels import quantize_rows as fused

        return fused(x, static_scale)
    return quantize_rows_reference(x, static_scale)


def scaled_mm_reference(
    xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor
) -> torch.Tensor:
    """(xq @ wq.T) * x_scale * w_scale in float32: what _scaled_mm computes, for shapes it
    refuses (cuBLASLt needs K and N divisible by 16)."""
    return (xq.float() @ wq.float().t()) * x_scale * w_scale.view(1, -1)


class Fp8Linear(nn.Module):
    """y = x @ W.T (+ bias) with W in fp8 and per-channel scales; x quantized per token.

    weight [N, K] fp8, weight_scale [N] float32, bias [N] in the model dtype (Qwen2's qkv),
    input_scale: a scalar float32 when the checkpoint calibrated static activation scales, else
    None (a scale per token, computed on the fly).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype = torch.bfloat16,
        static_input_scale: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.out_dtype = dtype  # the model's: what the bf16 linear it replaces returned
        self.weight = _frozen(torch.empty(out_features, in_features, dtype=FP8))
        self.weight_scale = _frozen(torch.empty(out_features, dtype=torch.float32))
        self.bias = _frozen(torch.empty(out_features, dtype=dtype)) if bias else None
        static = _frozen(torch.empty((), dtype=torch.float32)) if static_input_scale else None
        self.input_scale = static
        # cuBLASLt's FP8 GEMM wants K and N divisible by 16; other shapes take the reference.
        self.use_scaled_mm = in_features % 16 == 0 and out_features % 16 == 0
        # Zeros that Triton GEMM launches adding their own K splits count in (fp8_gemm.py):
        # allocated at the first forward (the engine's eager warm-up, before any CUDA graph is
        # captured) and left zero by every launch.
        self.tile_counters: torch.Tensor | None = None
        # The tensor cores sum all of K in their own narrower accumulator (use_fast_accum), as
        # vLLM's and TensorRT-LLM's FP8 GEMMs do: EngineConfig.fp8_fast_accum (loader.py).
        self.fast_accum = False

    @classmethod
    def like(cls, linear: nn.Linear, static_input_scale: bool = False) -> Fp8Linear:
        """An empty Fp8Linear of linear's shape, on its device (meta before loading)."""
        with torch.device(linear.weight.device):
            return cls(
                linear.in_features,
                linear.out_features,
                bias=linear.bias is not None,
                dtype=linear.weight.dtype,
                static_input_scale=static_input_scale,
            )

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        """linear's weights quantized per output channel (quantize at load)."""
        fp8 = cls.like(linear)
        q, scale = quantize_weight(linear.weight)
        fp8.weight.data, fp8.weight_scale.data = q, scale
        if linear.bias is not None:
            fp8.bias.data = linear.bias.data
        return fp8

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        """x [..., K] (quantized here), or rows quantized by the op that produced them."""
        if isinstance(x, Fp8Activation):
            (xq, x_scale), lead = x, x.q.shape[:-1]
        else:
            lead = x.shape[:-1]
            xq, x_scale = quantize_rows(x.reshape(-1, self.in_features), self.input_scale)
        if self.use_scaled_mm:
            # cuBLASLt, or the Triton kernel where fp8_gemm_table.json measured it faster.
            from bulkgen.model.fp8_gemm_table import fp8_matmul, tile_counters_needed

            if self.tile_counters is None:
                needed = tile_counters_needed(self.out_features, self.in_features)
                self.tile_counters = torch.zeros(needed, dtype=torch.int32, device=xq.device)
            out = fp8_matmul(
                xq, x_scale, self.weight, self.weight_scale, self.tile_counters, self.fast_accum
            )
        else:
            out = scaled_mm_reference(xq, x_scale, self.weight, self.weight_scale)
        out = out.to(self.out_dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        activations = "dynamic per-token" if self.input_scale is None else "static per-tensor"
        return f"in={self.in_features}, out={self.out_features}, fp8 weights, {activations}"


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def fp8_module_names(model: nn.Module) -> list[str]:
    """Names of the model's linears that FP8 applies to (the decoder's projections)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in FP8_TARGETS
    ]


def replace_modules(model: nn.Module, names: list[str], build) -> None:
    """Swap each named submodule for build(old)."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, build(getattr(parent, child)))


def quantize_model(model: nn.Module) -> None:
    """Quantize the model's loaded projections to FP8 in place (--quantization fp8)."""
    replace_modules(model, fp8_module_names(model), Fp8Linear.from_linear)


def set_fast_accum(model: nn.Module) -> None:
    """Let every FP8 projection's GEMM sum in the tensor cores' own accumulator."""
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            module.fast_accum = True


def fuse_input_quantization(model: nn.Module) -> None:
    """On CUDA, let the norms and SiLU that feed dynamic-FP8 projections write FP8 rows and their
    scales themselves (fp8_fused.py) rather than bf16 that each projection quantizes again.

    In llama.py a DecoderLayer's ops feed only its qkv and gate_up projections (its two norms),
    and an MLP's only its down projection (SiLU * up); attention's ops (q/k norm, rotary) and the
    final norm keep theirs. So swapping those two namespaces changes what flows nowhere else.
    """
    from bulkgen.model.fp8_fused import fp8_ops

    def dynamic(module: nn.Module) -> bool:
        return isinstance(module, Fp8Linear) and module.input_scale is None

    for layer in model.model.layers:
        if dynamic(layer.self_attn.qkv_proj) and dynamic(layer.mlp.gate_up_proj):
            layer.ops = fp8_ops(layer.ops)
        if dynamic(layer.mlp.down_proj):
            layer.mlp.ops = fp8_ops(layer.mlp.ops)
