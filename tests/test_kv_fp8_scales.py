"""The FP8 KV cache's scales from a checkpoint: the tensor names llm-compressor, AutoFP8 and
ModelOpt write, what a layer quantizes with once they are loaded, and the refusal of a zero or
negative scale (test_kv_fp8.py: the rest of the FP8 cache; `allow_fp8`: conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from test_kv_fp8 import greedy

from bulkgen import LLM
from bulkgen.model.attention import torch_backend
from bulkgen.model.attention.kv_fp8 import kv_scale_target, load_kv_scale


@pytest.mark.parametrize(
    "name, target",
    [
        ("model.layers.3.self_attn.k_scale", (3, ("k",))),  # compressed-tensors
        ("model.layers.3.self_attn.v_scale", (3, ("v",))),
        ("model.layers.0.self_attn.kv_scale", (0, ("k", "v"))),  # AutoFP8: one for both
        ("model.layers.12.self_attn.k_proj.k_scale", (12, ("k",))),  # ModelOpt
        ("model.layers.12.self_attn.v_proj.v_scale", (12, ("v",))),
        ("model.layers.5.self_attn.k_proj.output_scale", (5, ("k",))),
        ("model.layers.5.self_attn.v_proj.output_scale", (5, ("v",))),
        ("model.layers.5.self_attn.k_proj.weight_scale", None),  # an FP8 weight's scale
        ("model.layers.5.self_attn.k_proj.input_scale", None),
        ("model.layers.5.self_attn.k_proj.weight", None),
        ("model.norm.weight", None),
    ],
)
def test_checkpoint_kv_scale_names_map_to_their_layer(name, target):
    assert kv_scale_target(name) == target


def test_loaded_scales_are_what_the_layers_quantize_with(tiny_model_dir, allow_fp8):
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu", kv_cache_dtype="fp8")
    model = llm.engine.runner.model
    assert load_kv_scale(model, "model.layers.1.self_attn.k_scale", torch.tensor(0.5))
    assert load_kv_scale(model, "model.layers.0.self_attn.kv_scale", torch.tensor([0.25, 2.0]))
    assert not load_kv_scale(model, "model.layers.0.mlp.down_proj.weight", torch.ones(2))
    layers = [layer.self_attn for layer in model.model.layers]
    assert (layers[1].k_scale, layers[1].v_scale) == (0.5, 1.0)
    assert (layers[0].k_scale, layers[0].v_scale) == (2.0, 2.0)  # per-head: the largest
    # The cache holds x / k_scale: with k_scale 2, prompts' keys are stored at half size.
    calls = []
    real_write = torch_backend.write_kv

    def spy(k, v, k_cache, v_cache, slots, k_scale=1.0, v_scale=1.0, **pairs):  # kv_pairs.py
        calls.append((k_scale, v_scale))
        real_write(k, v, k_cache, v_cache, slots, k_scale, v_scale, **pairs)

    llm.engine.runner.model.model.layers[0].self_attn.backend = _with_write(layers[0], spy)
    llm.generate([[5, 6, 7]], greedy(2))
    assert calls and set(calls) == {(2.0, 2.0)}


def test_a_zero_or_negative_scale_is_refused_naming_the_tensor(tiny_model_dir, allow_fp8):
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="layers.1.self_attn.v_scale"):
        load_kv_scale(llm.engine.runner.model, "model.layers.1.self_attn.v_scale", torch.zeros(1))


def test_a_checkpoints_kv_scales_are_read_at_load(tmp_path, tiny_model_dir, allow_fp8):
    """llm-compressor writes self_attn.k_scale/v_scale beside the weights; ModelOpt writes
    k_proj.k_scale (whose name holds a fused projection's): both set their layer's scales."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "with-scales"
    shutil.copytree(tiny_model_dir, folder)
    (weights,) = folder.glob("*.safetensors")
    tensors = load_file(weights)
    tensors["model.layers.0.self_attn.k_scale"] = torch.tensor(0.5)
    tensors["model.layers.0.self_attn.v_scale"] = torch.tensor(0.25)
    tensors["model.layers.1.self_attn.k_proj.k_scale"] = torch.tensor(2.0)
    save_file(tensors, weights)
    llm = LLM(str(folder), dtype="float32", device="cpu", kv_cache_dtype="fp8")
    layers = [layer.self_attn for layer in llm.engine.runner.model.model.layers]
    assert (layers[0].k_scale, layers[0].v_scale) == (0.5, 0.25)
    assert (layers[1].k_scale, layers[1].v_scale) == (2.0, 1.0)
    assert llm.generate([[5, 6, 7]], greedy(3))[0].token_ids  # and it runs


def _with_write(attention, write):
    """attention's backend with another write_kv (to observe the scales it is called with)."""
    from dataclasses import replace

    return replace(attention.backend, write_kv=write)
