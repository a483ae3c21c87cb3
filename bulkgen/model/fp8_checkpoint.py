"""Pre-quantized FP8 checkpoints as Hugging Face writes them: what their config.json's
`quantization_config` says, which modules they store in FP8, and where their scale tensors go.

Two kinds load: `compressed-tensors` (llm-compressor's `*-FP8` models: format float-quantized,
8-bit float weights with per-tensor or per-channel `weight_scale`, activations dynamic or with a
static per-tensor `input_scale`) and `fp8` (transformers' FineGrainedFP8 without blocks:
`weight_scale_inv`, the multiplier despite its name, and `activation_scale`). Any other scheme is
refused in one line that names it. Which modules are FP8 is read from the checkpoint itself (an
fp8 weight tensor), so modules a config `ignore`s (lm_head, say) load as they are stored.

Scales are kept exactly in our fused layout: a fused projection's weight scale is per output row,
each q/k/v (or gate/up) part's scale repeated over its rows; its static input scale, shared by the
parts because they read the same input, is the largest of theirs (no part's inputs clip).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from bulkgen.model.fp8 import FP8_TARGETS

_SCALE_NAMES = {  # checkpoint tensor suffix -> our parameter name
    "weight_scale": "weight_scale",
    "weight_scale_inv": "weight_scale",
    "input_scale": "input_scale",
    "activation_scale": "input_scale",
}
_FP8_DTYPE_TAGS = ("F8_E4M3",)  # safetensors' name of float8_e4m3fn


@dataclass(frozen=True)
class Fp8Checkpoint:
    """An FP8 checkpoint's scheme: its kind and whether activations have static scales."""

    kind: str  # compressed-tensors | fp8
    static_activations: bool

    def describe(self) -> dict:
        activations = "static per-tensor" if self.static_activations else "dynamic per-token"
        return _described(f"checkpoint ({self.kind})", activations)


def _described(source: str, activations: str) -> dict:
    weights = "float8_e4m3fn, per-output-channel scales"
    return {"method": "fp8", "source": source, "weights": weights, "activations": activations}


def weight_quantization(config: dict, requested: str | None, dummy: bool = False) -> dict | None:
    """How the weights of a model (its config.json dict) will be quantized, as stats.json
    records it; None when they are not. A checkpoint's own scheme wins over --quantization."""
    scheme = None if dummy else checkpoint_quantization(config)
    if scheme is not None:
        return scheme.describe()
    return _described("quantized at load", "dynamic per-token") if requested == "fp8" else None


def checkpoint_quantization(config: dict) -> Fp8Checkpoint | None:
    """The FP8 scheme of a config.json dict, None when it has no quantization_config; a
    ValueError naming the scheme when bulkgen cannot run it."""
    q = config.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method == "fp8":
        return _hf_fp8(q)
    raise ValueError(
        f"quantization method {method!r} in config.json is not supported: bulkgen loads FP8 "
        "checkpoints (compressed-tensors float-quantized, or fp8) or quantizes a bf16 one with "
        "--quantization fp8"
    )


def _unsupported(what: str) -> ValueError:
    return ValueError(
        f"FP8 checkpoint scheme not supported: {what}; bulkgen loads float8_e4m3 weights with "
        "per-tensor or per-channel scales (or quantizes a bf16 checkpoint with --quantization fp8)"
    )


def _compressed_tensors(q: dict) -> Fp8Checkpoint:
    groups = q.get("config_groups") or {}
    if not groups:
        raise _unsupported("compressed-tensors without config_groups")
    static = set()
    for name, group in groups.items():
        fmt = group.get("format") or q.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            raise _unsupported(f"compressed-tensors format {fmt!r} (group {name})")
        w = group.get("weights") or {}
        if w.get("type") != "float" or w.get("num_bits") != 8:
            raise _unsupported(
                f"{w.get('num_bits')}-bit {w.get('type')} weights (compressed-tensors {name})"
            )
        if w.get("strategy") not in ("tensor", "channel"):
            strategy = w.get("strategy")
            raise _unsupported(f"{strategy}-wise weight scales (compressed-tensors {name})")
        if w.get("symmetric") is False:
            raise _unsupported(f"asymmetric weights with zero points (compressed-tensors {name})")
        a = group.get("input_activations")
        if a is None:  # weight-only: activations are then quantized per token on the fly
            static.add(False)
            continue
        if a.get("type") != "float" or a.get("num_bits") != 8:
            raise _unsupported(
                f"{a.get('num_bits')}-bit {a.get('type')} activations (compressed-tensors {name})"
            )
        if a.get("dynamic") in (False, "false") and a.get("strategy") != "tensor":
            raise _unsupported(f"static {a.get('strategy')}-wise activation scales ({name})")
        static.add(a.get("dynamic") in (False, "false"))
    if len(static) > 1:
        raise _unsupported("groups mixing static and dynamic activation scales")
    return Fp8Checkpoint("compressed-tensors", static.pop())


def _hf_fp8(q: dict) -> Fp8Checkpoint:
    block = q.get("weight_block_size")
    if block:
        raise _unsupported(f"block-wise weight scales (fp8 weight_block_size {list(block)})")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _unsupported(f"fp8 activation_scheme {scheme!r}")
    return Fp8Checkpoint("fp8", scheme == "static")


def fp8_modules(files: list[Path], fused: dict[str, tuple[str, int]]) -> list[str]:
    """Our names of the projections a checkpoint stores in FP8 (their weight tensor's dtype),
    read from the safetensors headers; fused: HF name part -> (our name part, shard index)."""
    from safetensors import safe_open

    parts: dict[str, set[bool]] = {}  # our module name -> fp8-ness of each of its parts
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                module, _, leaf = name.rpartition(".")
                kind = module.rsplit(".", 1)[-1]
                if leaf != "weight" or (kind not in fused and kind not in FP8_TARGETS):
                    continue
                is_fp8 = f.get_slice(name).get_dtype() in _FP8_DTYPE_TAGS
                if kind in fused:
                    module = module[: -len(kind)] + fused[kind][0]
                parts.setdefault(module, set()).add(is_fp8)
    mixed = sorted(m for m, kinds in parts.items() if len(kinds) > 1)
    if mixed:
        raise _unsupported(f"{mixed[0]}'s fused parts mix FP8 and unquantized weights")
    return sorted(m for m, kinds in parts.items() if True in kinds)


def scale_target(name: str) -> str | None:
    """Our name for a checkpoint's scale tensor (…q_proj.weight_scale_inv -> …weight_scale);
    None for any other tensor."""
    module, _, leaf = name.rpartition(".")
    ours = _SCALE_NAMES.get(leaf)
    return None if ours is None else f"{module}.{ours}"


def is_zero_point(name: str) -> bool:
    """compressed-tensors may store zero points even for symmetric weights: all zeros, unused."""
    return name.endswith(("weight_zero_point", "input_zero_point"))


def copy_part(
    param: torch.Tensor, tensor: torch.Tensor, name: str, start: int, size: int, first: bool
) -> None:
    """Copy a checkpoint tensor into rows start:start+size of our parameter `name`: a weight
    scale (per-tensor or per-channel) repeated or copied per row, a static input scale as the
    largest over the fused parts (first: this parameter has no part written yet), any other
    tensor as it is."""
    if name.endswith(".weight_scale"):
        param.narrow(0, start, size).copy_(tensor.float().reshape(-1).expand(size))
    elif name.endswith(".input_scale"):
        value = tensor.float().reshape(())
        param.copy_(value if first else torch.maximum(param, value))
    else:
        param.narrow(0, start, size).copy_(tensor)
