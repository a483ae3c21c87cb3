"""The FP8 KV cache: which dtype the cache has, its per-layer scales, and the arithmetic.

`kv_cache_dtype="fp8"` stores keys and values as float8_e4m3fn (1 byte per element instead of
bf16's 2, so the same memory holds twice the tokens). Each attention layer has a float32 k_scale
and v_scale: a stored value is x8 = fp8(clamp(x / scale, -448, 448)) and stands for x8 * scale.
Without calibrated scales (dummy weights, bf16 checkpoints) both are 1.0, as in vLLM: e4m3 then
covers |x| up to 448 with 3 mantissa bits, and down to 2**-9 in its subnormals (the demo model's
largest |key| or |value| over its demo prompts and answers is 23.7: scripts/accuracy_kv.py).
FP8 checkpoints made by llm-compressor / compressed-tensors or ModelOpt carry calibrated scales
per layer; kv_scale_target names them and load_kv_scale puts one on its layer (the loader calls
it for each checkpoint tensor).

The scales apply to an fp8 cache only; a bf16/fp32 cache stores values as they are. The Triton
kernels fold them out of their inner loops: k_scale into the softmax scale, v_scale into the
final normalisation (q . (k8 * s) = (q . k8) * s), so reading the cache costs only the cast.

FP8 needs the hardware's FP8 conversions (compute capability 8.9: Ada, Hopper and later). A run
anywhere else stops before loading anything (check_kv_cache_dtype); tests that run the fp8 path
on the CPU replace fp8_supported.
"""

from __future__ import annotations

import re

import torch

from bulkgen.model.attention.kv_layout import v_slots_inner
from bulkgen.model.switches import ATTN_FP8_PV_ENV, switch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_MIN_CAPABILITY = (8, 9)
# An fp8 cache's P @ V on e4m3 operands in the prefill kernel (values slots inner, a 16-bit
# query): the softmax weights p (<= 1) times P_SCALE rounded to e4m3 against the cache's V bytes
# as they are (no widening of the V tile); the row sums stay float32 and the output is divided by
# P_SCALE (a power of two: exact). Compiled for sm_90 (scripts/compile_check_attention.py,
# "prefill-pvfp8") it multiplies on wgmma's e4m3 form, 96 e4m3 conversions against 128. Not in
# the decode kernel: at its 16-row tiles Triton 3.9 widens both fp8 operands to fp16 for sm_90's
# mma.sync (144 conversions against 128, no e4m3 product); with 64-row tiles it takes wgmma but
# the softmax over the padding rows grows the kernel to 2,186 PTX instructions against 1,333.
# scripts/accuracy_attn_fp8.py's float32 emulation of it over the FP8 cache (24 texts, 4,395
# positions; README, FP8 weights): top-1 0.957 and mean KL 0.0080 at x256 against 0.958-0.960
# and 0.0090 without. Off until timed on a GPU; BULKGEN_ATTN_FP8_PV (1/0) switches it for A/B
# runs.
FP8_PV = False
P_SCALE = 256.0


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type: the model's own for "auto", float8_e4m3fn for "fp8", int8 for
    "int8" (kv_int8.py: a scale per token and kv head, on any device)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype == "fp8":
        return FP8_DTYPE
    if kv_cache_dtype == "int8":
        return torch.int8
    raise ValueError(f"kv_cache_dtype must be auto, fp8 or int8, got {kv_cache_dtype!r}")


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_DTYPE


def fp8_pv(q: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether a prefill launch runs P @ V on e4m3 operands (FP8_PV): an fp8 cache whose values
    are stored slots inner (the K-major operand the FP8 tensor cores take), a 16-bit query."""
    eligible = is_fp8(v_cache) and v_slots_inner(v_cache) and q.dtype != torch.float32
    return eligible and switch(ATTN_FP8_PV_ENV, FP8_PV)


def fp8_supported(device: torch.device) -> bool:
    """Whether the device converts to and from FP8 in hardware (CUDA compute capability 8.9+)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= FP8_MIN_CAPABILITY


def check_kv_cache_dtype(kv_cache_dtype: str, device: torch.device) -> None:
    """Refuse an fp8 cache where the hardware has no FP8, in one line, before any work."""
    resolve_kv_dtype(kv_cache_dtype, torch.float32)  # the name itself
    if kv_cache_dtype != "fp8" or fp8_supported(device):
        return
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        where = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
    else:
        where = f"the {device.type.upper()}"
    raise ValueError(
        f"--kv-cache-dtype fp8 needs a GPU with FP8 support (compute capability 8.9 or newer: "
        f"Ada, Hopper, Blackwell), and this run is on {where}; use --kv-cache-dtype auto"
    )


# ---- the arithmetic (the torch reference; the Triton kernels do the same) -----------------


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale, saturated to e4m3's finite range, rounded to nearest even."""
    # Multiplying by the reciprocal is what the write kernel does too: bit-identical on the GPU.
    return (x.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(x8: torch.Tensor, scale: float) -> torch.Tensor:
    """The float32 values an fp8 tensor stands for."""
    return x8.float() * scale


# ---- scales from a checkpoint --------------------------------------------------------------

# What FP8 checkpoints call a layer's KV-cache scales, and which of ours each one sets:
# compressed-tensors / llm-compressor: self_attn.k_scale, self_attn.v_scale;
# ModelOpt: self_attn.k_proj.k_scale, self_attn.v_proj.v_scale;
# older compressed-tensors: self_attn.k_proj.output_scale, self_attn.v_proj.output_scale;
# the first FP8 format (AutoFP8): one self_attn.kv_scale for both.
_SCALE_NAME = re.compile(
    r"^(?:model\.)?layers\.(\d+)\.self_attn\."
    r"(k_scale|v_scale|kv_scale|k_proj\.k_scale|v_proj\.v_scale"
    r"|k_proj\.output_scale|v_proj\.output_scale)$"
)
_TARGETS = {
    "k_scale": ("k",),
    "v_scale": ("v",),
    "kv_scale": ("k", "v"),
    "k_proj.k_scale": ("k",),
    "v_proj.v_scale": ("v",),
    "k_proj.output_scale": ("k",),
    "v_proj.output_scale": ("v",),
}


def kv_scale_target(name: str) -> tuple[int, tuple[str, ...]] | None:
    """(layer index, ("k",) / ("v",) / both) for a checkpoint tensor holding a KV-cache scale,
    None for any other tensor."""
    m = _SCALE_NAME.match(name)
    if m is None:
        return None
    return int(m.group(1)), _TARGETS[m.group(2)]


def load_kv_scale(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Set the scale a checkpoint tensor holds on its attention layer; False if `name` is no
    KV-cache scale (the loader then treats it as a weight).

    A scale is one number (a per-tensor scale; a per-head one is reduced to its maximum, which
    never overflows where the finer scales did not). Read on the host once, at load time: the
    decode CUDA graphs capture the scales as they are when the runner is built.
    """
    target = kv_scale_target(name)
    if target is None:
        return False
    layer, which = target
    if layer >= len(model.model.layers):
        raise ValueError(
            f"KV-cache scale {name} is for layer {layer}; the model has "
            f"{len(model.model.layers)} layers"
        )
    value = float(tensor.float().max())
    if not value > 0.0 or value == float("inf"):
        raise ValueError(f"KV-cache scale {name} must be a positive finite number, got {value}")
    attention = model.model.layers[layer].self_attn
    for kind in which:
        setattr(attention, f"{kind}_scale", value)
    return True
