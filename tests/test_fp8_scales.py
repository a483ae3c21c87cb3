"""An FP8 checkpoint's scales as they load (model/fp8_scales.py, fp8_checkpoint.py): NaN,
infinite or negative weight scales, non-positive input scales and NaN block scales are one
ValueError naming the tensor (they loaded silently, and a GPU's outputs would have been NaN or
zero); scales of a shape no scheme writes are refused (a traceback from expand, or worse, a
[8, 8] block grid loaded as 64 per-row scales); float8_e5m2 weights are refused as such; a
KV-cache scale for a layer the model has not is one line. From helper-46's audit."""

from __future__ import annotations

import fp8_checkpoints as fc
import pytest
import torch
from safetensors.torch import load_file, save_file

from bulkgen.model.attention import get_backend
from bulkgen.model.config import ModelConfig
from bulkgen.model.loader import load_model
from bulkgen.model.parallel_layers import TensorParallel

CPU = torch.device("cpu")
O_PROJ = "model.layers.0.self_attn.o_proj"
K_SCALE = "model.layers.0.self_attn.k_proj.weight_scale"
Q_SCALE = "model.layers.0.self_attn.q_proj.weight_scale"
NAN = float("nan")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("fp8src")
    fc.build_source(src)
    return src, fc.calibrate(src)


def load(model_dir):
    cfg = ModelConfig.from_dir(model_dir)
    return load_model(model_dir, cfg, get_backend("torch", CPU), torch.float32, CPU,
                      tp=TensorParallel(0, 1))  # fmt: skip


def patched(source, tmp_path, strategy, patch, static=False, block=None):
    src, absmax = source
    out = fc.write_fp8(src, tmp_path / "ckpt", "compressed-tensors", strategy,
                       absmax=absmax if static else None, block=block)  # fmt: skip
    path = out / "model.safetensors"
    state = load_file(path)
    save_file(patch(state), path, metadata={"format": "pt"})
    return out


def setting(name, value):
    return lambda state: state | {name: value}


BAD_VALUES = [
    ("tensor", False, setting(K_SCALE, torch.tensor([NAN]))),
    ("tensor", False, setting(K_SCALE, torch.tensor([float("inf")]))),
    ("tensor", False, setting(K_SCALE, torch.tensor([-1.0]))),
    ("tensor", True, setting(f"{O_PROJ}.input_scale", torch.tensor([NAN]))),
    ("tensor", True, setting(f"{O_PROJ}.input_scale", torch.tensor([0.0]))),
]  # fmt: skip


@pytest.mark.parametrize("strategy, static, patch", BAD_VALUES)
def test_a_scale_that_is_not_finite_and_positive_is_refused(source, tmp_path, strategy, static,
                                                            patch):  # fmt: skip
    model_dir = patched(source, tmp_path, strategy, patch, static=static)
    with pytest.raises(ValueError, match=r"scale '.*(weight_scale|input_scale)' must be finite"):
        load(model_dir)


def test_a_nan_block_scale_is_refused(source, tmp_path):
    def nan_block(state):
        name = "model.layers.0.mlp.down_proj.weight_scale"
        scales = state[name].clone()
        scales[0, 0] = float("nan")
        return state | {name: scales}

    model_dir = patched(source, tmp_path, "block", nan_block, block=[32, 32])
    with pytest.raises(ValueError, match="down_proj block scales' must be finite"):
        load(model_dir)


WRONG_SHAPES = [
    ("channel", False, setting(f"{O_PROJ}.weight_scale", torch.full((32, 1), 0.01))),
    ("channel", False, setting(f"{O_PROJ}.weight_scale", torch.full((64, 2), 0.01))),
    ("channel", False, setting(Q_SCALE, torch.full((32, 1), 0.01))),
    ("tensor", True, setting(f"{O_PROJ}.input_scale", torch.full((64,), 0.01))),
    ("channel", False, setting(f"{O_PROJ}.weight_scale", torch.full((8, 8), 0.01))),  # 64 values
]  # fmt: skip


@pytest.mark.parametrize("strategy, static, patch", WRONG_SHAPES)
def test_a_scale_of_a_shape_no_scheme_writes_is_refused(source, tmp_path, strategy, static, patch):
    model_dir = patched(source, tmp_path, strategy, patch, static=static)
    with pytest.raises(ValueError, match=r"scale '.*' is \[.*\] in the checkpoint"):
        load(model_dir)


def test_float8_e5m2_weights_are_refused_as_such(source, tmp_path):
    def e5m2(state):
        return {k: v.float().to(torch.float8_e5m2) if v.dtype == torch.float8_e4m3fn else v
                for k, v in state.items()}  # fmt: skip

    with pytest.raises(ValueError, match="F8_E5M2"):
        load(patched(source, tmp_path, "channel", e5m2))


def test_a_kv_scale_for_a_layer_the_model_has_not_is_one_line(source, tmp_path):
    model_dir = patched(source, tmp_path, "channel",
                        setting("model.layers.5.self_attn.k_scale", torch.tensor(0.5)))  # fmt: skip
    with pytest.raises(ValueError, match="for layer 5; the model has 2 layers"):
        load(model_dir)
