"""FP8 checkpoints as Hugging Face writes them, written by the tests (compressed-tensors and fp8
kinds; per-tensor, per-channel or block-wise weight scales; static input scales), and the tiny
model they are written from, with the helpers that load and run them on the CPU.

The checkpoints come from a tiny Llama whose fused parts are rescaled without changing its
function (q / 8 and k * 8, v / 4 and o * 4, up * 4 and down / 4), so that the per-tensor scales
of the q/k/v and gate/up parts (fused into one projection on load) differ: a loader that kept one
scale for the fused rows would be far off. The oracle is the same weights loaded unquantized. Its
weights are drawn with std 0.05 rather than the shared tiny models' 0.2, at which two random
layers amplify any rounding into logits that say little.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from bulkgen.model.attention import get_backend
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.config import ModelConfig
from bulkgen.model.fp8 import FP8, FP8_MAX
from bulkgen.model.loader import load_model

CPU = torch.device("cpu")
IDS = list(range(5, 45))
# Function-preserving: q.k, v -> o and silu(gate) * up -> down are unchanged.
PART_SCALES = {"q_proj": 0.125, "k_proj": 8.0, "v_proj": 0.25, "o_proj": 4.0, "up_proj": 4.0}
PART_SCALES |= {"down_proj": 0.25}
# Static input scales of the fused parts, relative to the calibrated one: the loader keeps the
# largest (k's) for the fused qkv_proj.
INPUT_SCALE_FACTORS = {
    "q_proj": 1.0,
    "k_proj": 2.0,
    "v_proj": 0.5,
    "gate_proj": 1.0,
    "up_proj": 1.5,
}
TOLERANCE = 0.15  # relative error of the logits: measured 0.06-0.07 (0.66 with one q/k/v scale)


def logits(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """One prefill of ids through the model's torch attention: logits [len(ids), vocab]."""
    cfg, T, block = model.cfg, len(ids), 16
    blocks = -(-T // block)
    shape = (blocks, block, cfg.num_kv_heads, cfg.head_dim)
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    meta = AttnMetadata(
        slot_mapping=torch.arange(T),
        query_start_loc=torch.tensor([0, T], dtype=torch.int32),
        seq_lens=torch.tensor([T], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        max_query_len=T,
        max_seq_len=T,
        decode_only=False,
        query_lens_host=[T],
        seq_lens_host=[T],
    )
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(T), meta, kv))


def load(model_dir: Path, quantization: str | None = None) -> nn.Module:
    cfg = ModelConfig.from_dir(model_dir)
    backend = get_backend("torch", CPU)
    return load_model(model_dir, cfg, backend, torch.float32, CPU, quantization=quantization)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref).norm() / ref.norm()).item()


def build_source(out: Path) -> Path:
    """A tiny Llama with its fused parts at different scales, unquantized (the oracle), in out."""
    out.mkdir(parents=True, exist_ok=True)
    from conftest import VOCAB_SIZE, _config, build_tokenizer
    from transformers import AutoModelForCausalLM

    config = _config("llama", VOCAB_SIZE, build_tokenizer(out).eos_token_id)
    config.initializer_range = 0.05
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    state = load_file(out / "model.safetensors")
    for name in state:
        for part, factor in PART_SCALES.items():
            if f".{part}." in name:
                state[name] = state[name] * factor
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def calibrate(model_dir: Path) -> dict[str, float]:
    """Largest input of each of our projections over IDS: what a calibration would see."""
    model, seen = load(model_dir), {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.endswith("proj"):
            module.register_forward_pre_hook(
                lambda m, args, name=name: seen.__setitem__(name, args[0].abs().max().item())
            )
    logits(model, IDS)
    return seen


def block_quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] in float8_e4m3fn with a scale per block (the last ones partial where the block
    does not divide the shape), as block-wise FP8 checkpoints store it."""
    rows, cols = block
    n, k = w.shape
    grid = torch.zeros(-(-n // rows), -(-k // cols))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            part = w[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols]
            grid[i, j] = part.abs().max() / FP8_MAX
    full = grid.repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]
    return (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8), grid


def write_fp8(
    src: Path, dst: Path, kind: str, strategy: str, absmax=None, ignore=(), block=None
) -> Path:
    """src's projections in float8_e4m3fn with the scale tensors `kind` names; absmax given:
    static input scales from it. Modules in `ignore` stay as they are. strategy "block": a scale
    per `block` ([rows, columns])."""
    dst.mkdir()
    for f in src.iterdir():
        shutil.copy(f, dst / f.name)
    state, out = load_file(src / "model.safetensors"), {}
    names = {"compressed-tensors": ("weight_scale", "input_scale")}
    weight_scale, input_scale = names.get(kind, ("weight_scale_inv", "activation_scale"))
    for name, w in state.items():
        module = name.removesuffix(".weight")
        part = module.rsplit(".", 1)[-1]
        if not name.endswith("proj.weight") or module in ignore:
            out[name] = w
            continue
        if strategy == "block":
            out[name], scale = block_quantize(w, block)
        else:
            if strategy == "tensor":
                scale = w.abs().max() / FP8_MAX
                scale = scale.reshape(1) if kind == "compressed-tensors" else scale
            else:
                scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
            out[name] = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        out[f"{module}.{weight_scale}"] = scale.float()
        if absmax is not None:
            fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"}
            fused |= {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
            ours = module.rsplit(".", 1)[0] + "." + fused.get(part, part)
            value = absmax[ours] / FP8_MAX * INPUT_SCALE_FACTORS.get(part, 1.0)
            out[f"{module}.{input_scale}"] = torch.tensor([value] if kind != "fp8" else value)
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    q = quantization_config(kind, strategy, absmax is not None, ignore, block)
    config["quantization_config"] = q
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def quantization_config(kind: str, strategy: str, static: bool, ignore=(), block=None) -> dict:
    block = list(block) if block else None
    if kind == "fp8":
        scheme = "static" if static else "dynamic"
        return {"quant_method": "fp8", "activation_scheme": scheme, "weight_block_size": block}
    activations = {"num_bits": 8, "type": "float", "symmetric": True}
    activations |= {"strategy": "tensor", "dynamic": False} if static else {"strategy": "token"}
    activations |= {} if static else {"dynamic": True}
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True}
    weights |= {"block_structure": block} if block else {}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head", *ignore],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights | {"dynamic": False},
                "input_activations": activations,
            }
        },
    }


# Each checkpoint kind with the weight scales it can have, blocks aside (test_fp8_blocks.py).
SCHEMES = [("compressed-tensors", "tensor"), ("compressed-tensors", "channel"), ("fp8", "tensor")]
