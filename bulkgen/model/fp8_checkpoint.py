"""Pre-quantized FP8 checkpoints as Hugging Face writes them: what their config.json's
`quantization_config` says, which modules they store in FP8, and where their scale tensors go.

Two kinds load: `compressed-tensors` (llm-compressor's `*-FP8` models: format float-quantized,
8-bit float weights with per-tensor, per-channel or block-wise `weight_scale`, activations dynamic
or with a static per-tensor `input_scale`) and `fp8` (transformers' FineGrainedFP8:
`weight_scale_inv`, the multiplier despite its name, per tensor or per block of
`weight_block_size`, and `activation_scale`). Any other scheme is refused in one line that names
it. Block-wise weights (Qwen's and DeepSeek's FP8 releases: a scale per 128 x 128 block) are
re-quantized per output row as they are read (BlockRequantizer): each weight dequantized with its
block scales, then quantized as --quantization fp8 quantizes a bf16 one; the GEMMs take per-row
scales only. Which modules are FP8 is read from the checkpoint itself (an
fp8 weight tensor), so modules a config `ignore`s (lm_head, say) load as they are stored.

Scales are kept exactly in our fused layout: a fused projection's weight scale is per output row,
each q/k/v (or gate/up) part's scale repeated over its rows; its static input scale, shared by the
parts because they read the same input, is the largest of theirs (no part's inputs clip).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from bulkgen.model.fp8 import FP8, FP8_TARGETS
from bulkgen.model.fp8_scales import check_scale, requantize_blocks

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
    weight_block: tuple[int, int] | None = None  # block-wise weight scales: a block's rows, cols

    def describe(self) -> dict:
        activations = "static per-tensor" if self.static_activations else "dynamic per-token"
        out = _described(f"checkpoint ({self.kind})", activations)
        if self.weight_block:
            rows, cols = self.weight_block
            out["weights"] += f", re-quantized at load from {rows}x{cols} block scales"
        return out


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
    static, blocks = set(), set()
    for name, group in groups.items():
        fmt = group.get("format") or q.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            raise _unsupported(f"compressed-tensors format {fmt!r} (group {name})")
        w = group.get("weights") or {}
        if w.get("type") != "float" or w.get("num_bits") != 8:
            raise _unsupported(
                f"{w.get('num_bits')}-bit {w.get('type')} weights (compressed-tensors {name})"
            )
        strategy = w.get("strategy")
        if strategy == "block":
            blocks.add(_block_shape(w.get("block_structure"), f"block_structure of {name}"))
        elif strategy in ("tensor", "channel"):
            blocks.add(None)
        else:
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
    if len(blocks) > 1:
        raise _unsupported("groups mixing block-wise weight scales with others or other blocks")
    return Fp8Checkpoint("compressed-tensors", static.pop(), blocks.pop())


def _hf_fp8(q: dict) -> Fp8Checkpoint:
    block = q.get("weight_block_size")
    block = _block_shape(block, "fp8 weight_block_size") if block is not None else None
    scheme = q.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _unsupported(f"fp8 activation_scheme {scheme!r}")
    return Fp8Checkpoint("fp8", scheme == "static", block)


def _block_shape(value, where: str) -> tuple[int, int]:
    """A block's [rows, columns] as the config gives it, checked."""
    ok = isinstance(value, (list, tuple)) and len(value) == 2
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        shown = list(value) if isinstance(value, (list, tuple)) else value
        raise _unsupported(f"block-wise weight scales of block {shown} ({where}: [rows, columns])")
    return int(value[0]), int(value[1])


class BlockRequantizer:
    """A block-wise checkpoint's FP8 weights and their block scales, paired as they are read and
    passed on re-quantized per output row (requantize_blocks); every other tensor as it is."""

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = block

    def tensors(
        self, tensors: Iterator[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        pending: dict[str, dict[str, torch.Tensor]] = {}  # module -> the half read so far
        for name, tensor in tensors:
            module, _, leaf = name.rpartition(".")
            if is_weight_scale(name):
                half = "weight_scale"
            elif leaf == "weight" and tensor.dtype == FP8:
                half = "weight"
            else:
                yield name, tensor
                continue
            halves = pending.setdefault(module, {})
            halves[half] = tensor
            if len(halves) == 2:
                del pending[module]
                q, scale = requantize_blocks(
                    halves["weight"], halves["weight_scale"], self.block, module
                )
                yield f"{module}.weight", q
                yield f"{module}.weight_scale", scale
        for module, halves in sorted(pending.items()):
            missing = "block scales" if "weight" in halves else "FP8 weight"
            raise ValueError(f"{module}: a block-wise FP8 checkpoint without its {missing}")


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
                if leaf != "weight":
                    continue
                dtype = f.get_slice(name).get_dtype()
                if dtype.startswith("F8") and dtype not in _FP8_DTYPE_TAGS:
                    raise _unsupported(f"{name} stored as {dtype} (only F8_E4M3 loads)")
                if kind not in fused and kind not in FP8_TARGETS:
                    if dtype in _FP8_DTYPE_TAGS:  # embeddings, lm_head: kept unquantized
                        raise _unsupported(f"{name} stored in FP8 (only the decoder's projections)")
                    continue
                is_fp8 = dtype in _FP8_DTYPE_TAGS
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


def is_weight_scale(name: str) -> bool:
    """A checkpoint's weight scale (weight_scale, or the fp8 kind's weight_scale_inv)."""
    return (scale_target(name) or "").endswith(".weight_scale")


def scale_shard(
    name: str, where: tuple[int, int, int], shape: list[int], block: tuple[int, int] | None
) -> tuple[int, int, int] | None:
    """Which part of a tensor other than a weight or a bias a tensor-parallel rank reads, given
    the (dim, start, length) slice of its module's weight: a weight scale per output row or per
    block is sliced with the weight's rows (column-parallel: dim 0) and a block one with its
    columns too (row-parallel: dim 1); every other scale (per tensor, per row of a row-parallel
    weight, static input scales, KV-cache scales, zero points) is read whole (None). A slice
    that does not fall on whole blocks is refused."""
    if not is_weight_scale(name) or math.prod(shape) == 1:
        return None
    dim, start, length = where
    if block is None:
        return (0, start, length) if dim == 0 else None
    step = block[dim]
    # A partial block only at the weight's end (past the start of the grid's last block)
    if start % step or (length % step and start + length <= (shape[dim] - 1) * step):
        raise ValueError(
            f"{name}: this rank's slice [{start}, {start + length}) of dim {dim} does not fall on "
            f"the checkpoint's {block[0]}x{block[1]} weight blocks; use fewer tensor-parallel ranks"
        )
    return dim, start // step, -(-length // step)


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
        shapes = ((), (1,), (1, 1), (size,), (size, 1), (1, size))  # per tensor, per row
        check_scale(tensor, name, shapes, "per-tensor or per-row", zero_ok=True)
        param.narrow(0, start, size).copy_(tensor.float().reshape(-1).expand(size))
    elif name.endswith(".input_scale"):
        check_scale(tensor, name, ((), (1,), (1, 1)), "static per-tensor", zero_ok=False)
        value = tensor.float().reshape(())
        param.copy_(value if first else torch.maximum(param, value))
    else:  # copy_ would broadcast a tensor of another shape, or fail in a traceback
        dest = param.narrow(0, start, size)
        if dest.shape != tensor.shape:
            raise ValueError(
                f"weight {name!r} is {tuple(tensor.shape)} in the checkpoint where the model, as "
                f"config.json shapes it, takes {tuple(dest.shape)}"
            )
        dest.copy_(tensor)
