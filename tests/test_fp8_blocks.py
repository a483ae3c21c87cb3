"""Block-wise FP8 checkpoints (a scale per block of weights, as Qwen's and DeepSeek's FP8 releases
ship): loaded with each weight re-quantized per output row from its dequantized blocks.

The checkpoints are written by fp8_checkpoints.py, as the per-tensor ones are, from the
same tiny Llama whose fused parts differ in scale; blocks of 16 x 24 leave partial blocks in
every projection's last column (64 and 128 inputs) so that the cropping is exercised.
"""

from __future__ import annotations

import json

import pytest
import torch
from fp8_checkpoints import (
    IDS,
    TOLERANCE,
    build_source,
    load,
    logits,
    relative_error,
    write_fp8,
)
from safetensors.torch import load_file, save_file

from bulkgen.model.fp8 import FP8, Fp8Linear, quantize_weight
from bulkgen.model.fp8_checkpoint import checkpoint_quantization
from bulkgen.model.fp8_scales import requantize_blocks

BLOCK = (16, 24)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return build_source(tmp_path_factory.mktemp("fp8-block-source"))


def dequantized(fp8_dir, name: str, scale_name: str) -> torch.Tensor:
    """A checkpoint weight as its blocks say, in float32."""
    state = load_file(fp8_dir / "model.safetensors")
    w, grid = state[name], state[scale_name]
    n, k = w.shape
    full = grid.repeat_interleave(BLOCK[0], 0)[:n].repeat_interleave(BLOCK[1], 1)[:, :k]
    return w.float() * full


@pytest.mark.parametrize("kind", ["fp8", "compressed-tensors"])
def test_a_block_wise_checkpoint_loads_each_part_requantized_per_row(source, tmp_path, kind):
    fp8_dir = write_fp8(source, tmp_path / "fp8", kind, "block", block=BLOCK)
    model, ref = load(fp8_dir), load(source)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, Fp8Linear) and qkv.weight.dtype == FP8
    assert qkv.weight_scale.shape == (qkv.weight.shape[0],), "one scale per output row"
    scale_leaf = "weight_scale_inv" if kind == "fp8" else "weight_scale"
    cfg, start = model.cfg, 0
    for part, size in (("q_proj", cfg.q_size), ("k_proj", cfg.kv_size), ("v_proj", cfg.kv_size)):
        prefix = f"model.layers.0.self_attn.{part}"
        blocks = dequantized(fp8_dir, f"{prefix}.weight", f"{prefix}.{scale_leaf}")
        q, scale = quantize_weight(blocks)  # what --quantization fp8 makes of those weights
        rows = slice(start, start + size)
        assert torch.equal(qkv.weight[rows].view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(qkv.weight_scale[rows], scale)
        start += size
    down = model.model.layers[1].mlp.down_proj  # 128 inputs: 5 whole blocks and one of 8
    back = down.weight.float() * down.weight_scale[:, None]
    assert relative_error(back, ref.model.layers[1].mlp.down_proj.weight) < 0.05
    assert relative_error(logits(model, IDS), logits(ref, IDS)) < TOLERANCE


def test_stats_say_the_weights_were_requantized_from_blocks(source, tmp_path):
    fp8_dir = write_fp8(source, tmp_path / "fp8", "fp8", "block", block=BLOCK)
    scheme = checkpoint_quantization(json.loads((fp8_dir / "config.json").read_text()))
    assert scheme.weight_block == BLOCK and not scheme.static_activations
    assert scheme.describe()["weights"].endswith("re-quantized at load from 16x24 block scales")


def test_block_scales_of_the_wrong_shape_are_refused_naming_the_module(source, tmp_path):
    fp8_dir = write_fp8(source, tmp_path / "fp8", "fp8", "block", block=BLOCK)
    state = load_file(fp8_dir / "model.safetensors")
    name = "model.layers.0.mlp.gate_proj.weight_scale_inv"
    state[name] = state[name][:, :2].contiguous()  # the partial column of blocks left out
    save_file(state, fp8_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"gate_proj: block scales of shape \[8, 2\].*\[8, 3\]"):
        load(fp8_dir)


def test_a_weight_without_its_block_scales_is_refused(source, tmp_path):
    fp8_dir = write_fp8(source, tmp_path / "fp8", "fp8", "block", block=BLOCK)
    state = load_file(fp8_dir / "model.safetensors")
    del state["model.layers.1.self_attn.o_proj.weight_scale_inv"]
    save_file(state, fp8_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="o_proj: a block-wise FP8 checkpoint without its block"):
        load(fp8_dir)


def test_blocks_that_share_their_rows_scale_keep_their_bytes():
    """Where every block of a row has one scale, re-quantizing the row rounds nothing twice."""
    torch.manual_seed(0)
    q, _ = quantize_weight(torch.randn(32, 48))  # each row's largest value at 448
    band = torch.tensor([0.5, 3.0])  # one scale for each band of 16 rows
    q2, scale = requantize_blocks(q, band[:, None].expand(2, 2), (16, 24), "m")
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    assert torch.allclose(scale, band.repeat_interleave(16), rtol=1e-6, atol=0)


def test_compressed_tensors_groups_with_different_blocks_are_refused():
    weights = {"num_bits": 8, "type": "float", "strategy": "block", "symmetric": True}
    groups = {
        "a": {"format": "float-quantized", "weights": weights | {"block_structure": [128, 128]}},
        "b": {"format": "float-quantized", "weights": weights | {"block_structure": [64, 128]}},
    }
    q = {"quant_method": "compressed-tensors", "config_groups": groups}
    with pytest.raises(ValueError, match="mixing block-wise weight scales"):
        checkpoint_quantization({"quantization_config": q})
