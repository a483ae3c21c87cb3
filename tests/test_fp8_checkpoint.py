"""FP8 checkpoints as Hugging Face writes them (compressed-tensors and fp8 kinds), quantizing at
load, and the errors: an unsupported scheme, FP8 on the CPU.

The checkpoints are written here from a tiny Llama whose fused parts are rescaled without
changing its function (q / 8 and k * 8, v / 4 and o * 4, up * 4 and down / 4), so that the
per-tensor scales of the q/k/v and gate/up parts (fused into one projection on load) differ: a
loader that kept one scale for the fused rows would be far off. The oracle is the same weights
loaded unquantized. Its weights are drawn with std 0.05 rather than the shared tiny models' 0.2,
at which two random layers amplify any rounding into logits that say little.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from bulkgen.model.attention import get_backend
from bulkgen.model.attention.metadata import AttnMetadata
from bulkgen.model.config import ModelConfig
from bulkgen.model.fp8 import FP8, FP8_MAX, Fp8Linear
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


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return build_source(tmp_path_factory.mktemp("fp8-source"))


@pytest.fixture(scope="module")
def input_absmax(source) -> dict[str, float]:
    return calibrate(source)


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


@pytest.mark.parametrize("kind, strategy", SCHEMES)
def test_fp8_checkpoint_loads_with_each_fused_part_keeping_its_scale(
    source, tmp_path, kind, strategy
):
    fp8_dir = write_fp8(source, tmp_path / "fp8", kind, strategy)
    model, ref = load(fp8_dir), load(source)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, Fp8Linear) and qkv.weight.dtype == FP8 and qkv.input_scale is None
    cfg = model.cfg
    # Dequantized, the fused weight is the three parts' weights stacked, each to fp8 precision.
    ref_w = ref.model.layers[0].self_attn.qkv_proj.weight
    back = qkv.weight.float() * qkv.weight_scale[:, None]
    for start, size in (
        (0, cfg.q_size),
        (cfg.q_size, cfg.kv_size),
        (cfg.q_size + cfg.kv_size, cfg.kv_size),
    ):
        part = slice(start, start + size)
        assert relative_error(back[part], ref_w[part]) < 0.05
    assert relative_error(logits(model, IDS), logits(ref, IDS)) < TOLERANCE


def test_a_fused_projection_with_one_scale_for_all_parts_would_be_far_off(source, tmp_path):
    """What the test above guards against: k's scale 8x q's, v's 1/4 of it."""
    model, ref = (
        load(write_fp8(source, tmp_path / "fp8", "compressed-tensors", "tensor")),
        load(source),
    )
    for layer in model.model.layers:
        scale = layer.self_attn.qkv_proj.weight_scale
        scale.copy_(scale[0].expand_as(scale))  # q's scale over k and v too
    assert relative_error(logits(model, IDS), logits(ref, IDS)) > 3 * TOLERANCE


@pytest.mark.parametrize("kind", ["compressed-tensors", "fp8"])
def test_static_input_scales_load_and_a_fused_one_is_the_largest_of_its_parts(
    source, input_absmax, tmp_path, kind
):
    fp8_dir = write_fp8(source, tmp_path / "fp8", kind, "tensor", absmax=input_absmax)
    model, ref = load(fp8_dir), load(source)
    layer = model.model.layers[1]
    assert layer.self_attn.qkv_proj.input_scale.item() == pytest.approx(
        input_absmax["model.layers.1.self_attn.qkv_proj"] / FP8_MAX * 2.0  # k's
    )
    assert layer.mlp.gate_up_proj.input_scale.item() == pytest.approx(
        input_absmax["model.layers.1.mlp.gate_up_proj"] / FP8_MAX * 1.5  # up's
    )
    assert relative_error(logits(model, IDS), logits(ref, IDS)) < TOLERANCE


def test_ignored_modules_and_the_lm_head_stay_unquantized(source, tmp_path):
    ignored = "model.layers.1.self_attn.o_proj"
    fp8_dir = write_fp8(source, tmp_path / "fp8", "compressed-tensors", "tensor", ignore=(ignored,))
    model = load(fp8_dir)
    assert type(model.get_submodule(ignored)) is nn.Linear
    assert model.get_submodule(ignored).weight.dtype == torch.float32
    assert isinstance(model.model.layers[0].self_attn.o_proj, Fp8Linear)
    assert model.lm_head.weight.dtype == model.model.embed_tokens.weight.dtype == torch.float32
    assert relative_error(logits(model, IDS), logits(load(source), IDS)) < TOLERANCE


def test_quantization_fp8_quantizes_a_float_checkpoint_at_load(source):
    model, ref = load(source, quantization="fp8"), load(source)
    projections = [m for n, m in model.named_modules() if n.endswith("proj")]
    assert len(projections) == 4 * model.cfg.num_layers
    assert all(isinstance(m, Fp8Linear) and m.input_scale is None for m in projections)
    assert model.lm_head.weight.dtype == torch.float32
    assert relative_error(logits(model, IDS), logits(ref, IDS)) < TOLERANCE


@pytest.mark.parametrize(
    "change, named",
    [
        ({"quant_method": "fp8", "weight_block_size": [128]}, "block-wise weight scales"),
        ({"quant_method": "fp8", "weight_block_size": [128, 0]}, "block-wise weight scales"),
        ({"config_groups": {"g": {"format": "float-quantized", "weights": {
            "num_bits": 8, "type": "float", "strategy": "block"}}}}, "block-wise weight scales"),
        ({"format": "pack-quantized"}, "format 'pack-quantized'"),
        ({"config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}},
         "4-bit int weights"),
        ({"quant_method": "awq"}, "quantization method 'awq'"),
    ],
)  # fmt: skip
def test_an_unsupported_scheme_is_refused_naming_it(source, tmp_path, change, named):
    fp8_dir = write_fp8(source, tmp_path / "fp8", "compressed-tensors", "tensor")
    config = json.loads((fp8_dir / "config.json").read_text())
    config["quantization_config"] |= change
    (fp8_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=named):
        load(fp8_dir)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_quantizing_at_load_keeps_qwen2_biases_and_qwen3_norms_as_they_are(tiny_models, arch):
    model, ref = load(tiny_models[arch], quantization="fp8"), load(tiny_models[arch])
    attn, ref_attn = model.model.layers[0].self_attn, ref.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj, Fp8Linear)
    if arch == "qwen2":
        assert torch.equal(attn.qkv_proj.bias, ref_attn.qkv_proj.bias)
    else:
        assert torch.equal(attn.q_norm.weight, ref_attn.q_norm.weight)
    back = attn.qkv_proj.weight.float() * attn.qkv_proj.weight_scale[:, None]
    assert relative_error(back, ref_attn.qkv_proj.weight) < 0.05
    assert torch.isfinite(logits(model, IDS)).all()
