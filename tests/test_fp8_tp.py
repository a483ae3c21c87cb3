"""FP8 checkpoints split over tensor-parallel ranks: each rank reads its slice of every FP8 weight
and the matching part of its scales (per-row and block scales with the rows of a column-parallel
weight, block scales with the columns of a row-parallel one, everything else whole).

The engine refuses FP8 on the CPU, so these load each rank's model directly (no process group is
needed to load) and compare it with the whole model of one process, as
test_tensor_parallel.py's loading test does for a bf16 checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from fp8_checkpoints import SCHEMES, build_source, relative_error, write_fp8
from safetensors.torch import load_file

from bulkgen.model.attention import get_backend
from bulkgen.model.config import ModelConfig
from bulkgen.model.fp8 import Fp8Linear, quantize_weight
from bulkgen.model.fp8_checkpoint import scale_shard
from bulkgen.model.fp8_scales import requantize_blocks
from bulkgen.model.loader import load_model
from bulkgen.model.parallel_layers import TensorParallel

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return build_source(tmp_path_factory.mktemp("fp8-tp-source"))


def load(model_dir, rank: int = 0, size: int = 1, quantization: str | None = None):
    cfg = ModelConfig.from_dir(model_dir)
    backend = get_backend("torch", CPU)
    tp = TensorParallel(rank, size)
    return load_model(model_dir, cfg, backend, torch.float32, CPU, quantization=quantization, tp=tp)


def assert_gate_rows_are_the_whole_models(model, whole, rank: int, width: int) -> None:
    """A column-parallel rank quantized per row holds the whole model's rows, bytes and scales."""
    gate_up, full = model.model.layers[0].mlp.gate_up_proj, whole.model.layers[0].mlp.gate_up_proj
    rows = torch.arange(rank * width, (rank + 1) * width)
    assert same(gate_up.weight[:width], full.weight[rows])
    assert torch.equal(gate_up.weight_scale[:width], full.weight_scale[rows])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("kind, strategy", SCHEMES)
def test_each_rank_holds_its_slice_of_the_fp8_weights_and_their_scales(
    source, tmp_path, kind, strategy
):
    fp8_dir = write_fp8(source, tmp_path / "fp8", kind, strategy)
    whole = load(fp8_dir)
    cfg = whole.cfg
    for rank in range(2):
        model = load(fp8_dir, rank, 2)
        for i, layer in enumerate(model.model.layers):
            full = whole.model.layers[i]
            # Column-parallel: this rank's q, k and v rows, with their scales.
            qkv, full_qkv = layer.self_attn.qkv_proj, full.self_attn.qkv_proj
            assert isinstance(qkv, Fp8Linear)
            q, kv = cfg.q_size // 2, cfg.kv_size // 2
            rows = torch.cat(
                [
                    torch.arange(rank * q, (rank + 1) * q),
                    cfg.q_size + torch.arange(rank * kv, (rank + 1) * kv),
                    cfg.q_size + cfg.kv_size + torch.arange(rank * kv, (rank + 1) * kv),
                ]
            )
            assert same(qkv.weight, full_qkv.weight[rows])
            assert torch.equal(qkv.weight_scale, full_qkv.weight_scale[rows])
            # Row-parallel: this rank's columns, every row's scale.
            down, full_down = layer.mlp.down_proj, full.mlp.down_proj
            width = cfg.intermediate_size // 2
            assert same(down.weight, full_down.weight[:, rank * width : (rank + 1) * width])
            assert torch.equal(down.weight_scale, full_down.weight_scale)


def test_static_input_scales_are_read_whole_by_every_rank(source, tmp_path):
    absmax = {}  # a made-up calibration: one input bound per projection of ours
    for i in range(2):
        absmax |= {
            f"model.layers.{i}.self_attn.qkv_proj": 3.0,
            f"model.layers.{i}.mlp.down_proj": 5.0,
        }
        absmax |= {
            f"model.layers.{i}.self_attn.o_proj": 2.0,
            f"model.layers.{i}.mlp.gate_up_proj": 4.0,
        }
    fp8_dir = write_fp8(source, tmp_path / "fp8", "fp8", "tensor", absmax=absmax)
    whole = load(fp8_dir)
    for rank in range(2):
        model = load(fp8_dir, rank, 2)
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            ours = model.model.layers[1].get_submodule(name).input_scale
            assert torch.equal(ours, whole.model.layers[1].get_submodule(name).input_scale)


def test_block_wise_weights_are_sliced_on_their_blocks_then_requantized(source, tmp_path):
    block = (16, 16)
    fp8_dir = write_fp8(source, tmp_path / "fp8", "fp8", "block", block=block)
    state = load_file(fp8_dir / "model.safetensors")
    whole, ref = load(fp8_dir), load(source)
    cfg = whole.cfg
    width = cfg.intermediate_size // 2
    for rank in range(2):
        model = load(fp8_dir, rank, 2)
        # Column-parallel rows are re-quantized row by row: the whole model's rows exactly.
        assert_gate_rows_are_the_whole_models(model, whole, rank, width)
        # Row-parallel: this rank's columns and their blocks' scales, re-quantized on their own.
        prefix = "model.layers.0.mlp.down_proj"
        cols = slice(rank * width, (rank + 1) * width)
        grid = state[f"{prefix}.weight_scale_inv"][:, rank * width // 16 : (rank + 1) * width // 16]
        q, scale = requantize_blocks(state[f"{prefix}.weight"][:, cols], grid, block, prefix)
        down = model.model.layers[0].mlp.down_proj
        assert same(down.weight, q) and torch.equal(down.weight_scale, scale)
        back = down.weight.float() * down.weight_scale[:, None]
        assert relative_error(back, ref.model.layers[0].mlp.down_proj.weight[:, cols]) < 0.05


def test_a_rank_slice_across_a_block_is_refused(source, tmp_path):
    fp8_dir = write_fp8(source, tmp_path / "fp8", "fp8", "block", block=(24, 16))
    with pytest.raises(ValueError, match=r"does not fall on the checkpoint's 24x16 weight blocks"):
        load(fp8_dir, 1, 2)  # rank 1's query rows start at 32


def test_which_scales_a_rank_slices():
    q, o = (0, 32, 32), (1, 32, 32)  # the weight's slice: column- and row-parallel
    name = "model.layers.0.self_attn.q_proj.weight_scale"
    assert scale_shard(name, q, [64, 1], None) == (0, 32, 32)  # per row: the rank's rows
    assert scale_shard(name, o, [64, 1], None) is None  # row-parallel: every row
    assert scale_shard(name, q, [1], None) is None  # per tensor
    assert scale_shard(name + "_inv", q, [4, 4], (16, 16)) == (0, 2, 2)
    assert scale_shard(name + "_inv", o, [4, 4], (16, 16)) == (1, 2, 2)
    # A partial block only at the end: 100 rows in blocks of 16, the last rank from 64.
    assert scale_shard(name, (0, 64, 36), [7, 4], (16, 16)) == (0, 4, 3)
    with pytest.raises(ValueError, match="does not fall"):
        scale_shard(name, (0, 32, 36), [7, 4], (16, 16))
    for other in ("input_scale", "activation_scale", "k_scale", "weight_zero_point"):
        assert scale_shard(f"model.layers.0.self_attn.k_proj.{other}", q, [8], None) is None


def test_quantizing_at_load_quantizes_each_ranks_slice_per_row(source):
    """--quantization fp8 with ranks: a column-parallel rank's rows are the whole model's rows
    (per-row scales are row-local); a row-parallel rank quantizes its own columns per row."""
    whole, ref = load(source, quantization="fp8"), load(source)
    width = whole.cfg.intermediate_size // 2
    for rank in range(2):
        model = load(source, rank, 2, quantization="fp8")
        assert_gate_rows_are_the_whole_models(model, whole, rank, width)
        down = model.model.layers[0].mlp.down_proj
        cols = ref.model.layers[0].mlp.down_proj.weight[:, rank * width : (rank + 1) * width]
        q, scale = quantize_weight(cols)
        assert same(down.weight, q) and torch.equal(down.weight_scale, scale)
