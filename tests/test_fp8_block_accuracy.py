"""scripts/fp8_block_accuracy.py's checkpoints on the tiny Llama: the block-wise one loads as
bulkgen loads such checkpoints, and its float32 "block then row" weights are exactly what that
load multiplies by (the script's weights-only modes compare like with like)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from fp8_block_accuracy import teacher_forced_logprobs, write_blockwise, write_rounded  # noqa: E402

from bulkgen.model.attention import get_backend  # noqa: E402
from bulkgen.model.config import ModelConfig  # noqa: E402
from bulkgen.model.fp8 import Fp8Linear  # noqa: E402
from bulkgen.model.loader import load_model  # noqa: E402

CPU = torch.device("cpu")


def load(path: Path):
    cfg = ModelConfig.from_dir(path)
    return load_model(path, cfg, get_backend("torch", CPU), torch.float32, CPU)


def test_the_block_then_row_weights_are_what_the_blockwise_load_multiplies(
    tiny_model_dir, tmp_path
):
    blockwise = write_blockwise(Path(tiny_model_dir), tmp_path / "blockwise", (16, 24))
    fp8 = load(blockwise)
    rounded = load(
        write_rounded(Path(tiny_model_dir), blockwise, tmp_path / "rounded", "block-row")
    )
    down = fp8.model.layers[1].mlp.down_proj
    assert isinstance(down, Fp8Linear)
    back = down.weight.float() * down.weight_scale[:, None]
    assert torch.equal(back, rounded.model.layers[1].mlp.down_proj.weight)
    logprobs = teacher_forced_logprobs(fp8, list(range(5, 25)))
    assert logprobs.shape == (20, fp8.cfg.vocab_size)
    assert torch.allclose(logprobs.exp().sum(-1), torch.ones(20), atol=1e-4)
