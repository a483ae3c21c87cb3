"""Build a model on the device and fill it: safetensors straight to the device, or dummy weights.

Under tensor parallelism each rank reads only its slice of each weight (safetensors' get_slice
reads those bytes alone), so a rank's memory, and what it reads from disk, is about 1/N of the
model's; model.loaded_bytes counts what was read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError

from bulkgen.model.attention import AttentionBackend
from bulkgen.model.attention.kv_fp8 import load_kv_scale
from bulkgen.model.config import ModelConfig
from bulkgen.model.fp8 import (
    Fp8Linear,
    fuse_input_quantization,
    quantize_model,
    replace_modules,
    set_fast_accum,
)
from bulkgen.model.fp8_checkpoint import (
    BlockRequantizer,
    checkpoint_quantization,
    copy_part,
    fp8_modules,
    is_zero_point,
    scale_shard,
    scale_target,
)
from bulkgen.model.hub import indexed_shards
from bulkgen.model.invariant import make_batch_invariant
from bulkgen.model.llama import LlamaForCausalLM
from bulkgen.model.ops import get_ops
from bulkgen.model.parallel_layers import TensorParallel, WeightShard, local_config
from bulkgen.model.switches import apply_switches

# Hugging Face projections that we store fused: HF name part -> (our name part, shard index).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}

_VOCAB_TABLES = ("model.embed_tokens.weight", "lm_head.weight")  # split by rows across ranks

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device, cfg: ModelConfig) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        return torch.float16 if cfg.torch_dtype == "float16" else torch.bfloat16
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = aliases.get(dtype, dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, float32, bfloat16, float16")
    return DTYPES[name]


def load_model(
    model_dir: str | Path | None,
    cfg: ModelConfig,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device,
    load_format: str = "auto",
    tp: TensorParallel | None = None,
    quantization: str | None = None,
    batch_invariant: bool = False,
    fp8_fast_accum: bool = False,
) -> LlamaForCausalLM:
    """cfg: the whole model's shape; with tp, this rank's part of it is built and read.
    quantization "fp8": quantize the projections to FP8 once loaded (an FP8 checkpoint's own
    scheme, read from its config.json, wins). batch_invariant: every GEMM (projections and
    logits) through invariant.invariant_linear. fp8_fast_accum: the FP8 projections' GEMMs sum
    in the tensor cores' own accumulator (Fp8Linear.fast_accum)."""
    tp = tp or TensorParallel()
    apply_switches(device)  # before any GEMM is timed or captured (BULKGEN_BLAS)
    with torch.device("meta"):
        model = LlamaForCausalLM(local_config(cfg, tp.size), backend, get_ops(device), tp)
    model = model.to(dtype)
    scheme = None
    if load_format != "dummy":
        scheme = checkpoint_quantization(json.loads((Path(model_dir) / "config.json").read_text()))
    if scheme is not None:  # FP8 modules before to_empty: .to(dtype) would cast their weights
        static = scheme.static_activations
        names = fp8_modules(_checkpoint_files(Path(model_dir)), _FUSED)
        replace_modules(model, names, lambda linear: Fp8Linear.like(linear, static))
    model = model.to_empty(device=device).eval().requires_grad_(False)
    model.rotary.build(device)
    model.loaded_bytes = 0
    with torch.no_grad():
        if load_format == "dummy":
            _fill_dummy(model)
        else:
            slices = WeightShard(cfg, tp.rank, tp.size)
            block = scheme.weight_block if scheme else None
            model.loaded_bytes = _load_safetensors(model, Path(model_dir), slices, device, block)
        if quantization == "fp8" and scheme is None:
            quantize_model(model)
    if device.type == "cuda":  # the fused Triton ops: norms and SiLU write FP8 rows
        fuse_input_quantization(model)
    if fp8_fast_accum:
        set_fast_accum(model)
    if batch_invariant:
        make_batch_invariant(model)
    return model


def _fill_dummy(model: LlamaForCausalLM) -> None:
    """Random weights of a realistic scale: for benchmarks, where only shapes matter."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(0)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)


def _checkpoint_files(model_dir: Path) -> list[Path]:
    """The shards the index names (what hub.py downloads), else every *.safetensors."""
    if names := indexed_shards(model_dir):
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors weights found")
    return files


def _iter_tensors(
    files: list[Path],
    device: torch.device,
    slices: WeightShard,
    block: tuple[int, int] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each checkpoint tensor, or this rank's slice of it (only those bytes are read); an FP8
    checkpoint's scales sliced as their weights are (scale_shard; block: its weight blocks)."""
    target = str(device) if device.type != "cuda" or device.index is not None else "cuda:0"
    for path in files:
        try:
            yield from _file_tensors(path, target, slices, block)
        except SafetensorError as e:  # a truncated or damaged file: one line, not a traceback
            raise ValueError(
                f"{path} cannot be read ({e}): it is damaged or truncated; fetch or convert it "
                "again"
            ) from None


def _file_tensors(path: Path, target: str, slices: WeightShard, block):
    """_iter_tensors' tensors of one file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device=target) as f:
        for name in f.keys():
            where = slices.slice_of(name)
            if where is not None and name.rpartition(".")[2] not in ("weight", "bias"):
                where = scale_shard(name, where, f.get_slice(name).get_shape(), block)
            if where is None:
                yield name, f.get_tensor(name)
                continue
            dim, start, length = where
            part = f.get_slice(name)
            index = (slice(None),) * dim + (slice(start, start + length),)
            yield name, part[index].to(target)  # a no-op where the slice is there already


def _load_safetensors(
    model: LlamaForCausalLM,
    model_dir: Path,
    slices: WeightShard,
    device: torch.device,
    block: tuple[int, int] | None = None,
) -> int:
    """Fill the model from the checkpoint; returns the bytes of the tensors read (a block-wise
    FP8 checkpoint's weights re-quantized per row on the way: its scales count as the per-row
    ones that replace them)."""
    cfg = model.cfg  # this rank's shape
    params = dict(model.named_parameters())
    shards = {"qkv_proj": 3, "gate_up_proj": 2}
    # Every parameter, and every shard of a fused one, must be written exactly once.
    missing = set()
    for pname in params:
        fused = next((f for f in shards if f in pname), None)
        missing |= {f"{pname}#{i}" for i in range(shards[fused])} if fused else {f"{pname}#0"}
    shard_sizes = {"qkv_proj": [cfg.q_size, cfg.kv_size, cfg.kv_size]}
    shard_sizes["gate_up_proj"] = [cfg.intermediate_size] * 2
    loaded = 0
    written = set()  # a fused FP8 input scale is the largest of its parts'
    tensors = _iter_tensors(_checkpoint_files(model_dir), device, slices, block)
    for name, tensor in BlockRequantizer(block).tensors(tensors) if block else tensors:
        if "rotary_emb" in name or (name == "lm_head.weight" and model.lm_head is None):
            continue
        loaded += tensor.numel() * tensor.element_size()
        if load_kv_scale(model, name, tensor):  # before the fused names: k_proj.k_scale
            continue
        if is_zero_point(name):
            continue
        name = scale_target(name) or name  # FP8 scales under our parameter names
        parts = name.split(".")
        fused = next((p for p in parts if p in _FUSED), None)
        if fused is None:
            if name not in params:
                raise ValueError(f"{model_dir}: unexpected weight {name!r} for {cfg.architecture}")
            dest = params[name]
            if name in _VOCAB_TABLES and tensor.dim() and tensor.shape[0] <= dest.shape[0]:
                dest = dest.narrow(0, 0, tensor.shape[0])  # the last rank's rows end in padding
            copy_part(dest, tensor, name, 0, dest.shape[0] if dest.dim() else 1, first=True)
            missing.discard(f"{name}#0")
            continue
        target, shard = _FUSED[fused]
        our_name = name.replace(fused, target)
        if our_name not in params:
            raise ValueError(f"{model_dir}: unexpected weight {name!r} for {cfg.architecture}")
        sizes = shard_sizes[target]
        start = sum(sizes[:shard])
        copy_part(params[our_name], tensor, our_name, start, sizes[shard], our_name not in written)
        written.add(our_name)
        missing.discard(f"{our_name}#{shard}")
    if missing:
        names = sorted({m.split("#")[0] for m in missing})
        raise ValueError(f"{model_dir}: weights missing from the checkpoint: {names[:5]}")
    return loaded
