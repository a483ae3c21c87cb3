"""FP8 checkpoints as Hugging Face writes them (compressed-tensors and fp8 kinds), quantizing at
load, and the errors: an unsupported scheme, FP8 on the CPU. The checkpoints and their tiny
source model: fp8_checkpoints.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fp8_checkpoints import (
    IDS,
    SCHEMES,
    TOLERANCE,
    build_source,
    calibrate,
    load,
    logits,
    relative_error,
    write_fp8,
)
from torch import nn

from bulkgen.model.fp8 import FP8, FP8_MAX, Fp8Linear


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return build_source(tmp_path_factory.mktemp("fp8-source"))


@pytest.fixture(scope="module")
def input_absmax(source) -> dict[str, float]:
    return calibrate(source)


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
