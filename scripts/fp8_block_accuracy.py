"""What loading a block-wise FP8 checkpoint costs in accuracy, on real weights (CPU).

    PYTHONPATH=. python scripts/fp8_block_accuracy.py [--model smollm2-135m] [--block 128,128]

bulkgen re-quantizes a block-wise checkpoint's weights per output row at load (fp8_checkpoint.
BlockRequantizer): each weight is rounded twice, once by whoever made the checkpoint, once by
us. This writes the model's projections as a block-wise FP8 checkpoint (transformers' `fp8` kind,
a `weight_scale_inv` per block, partial blocks where the block does not divide the shape: the
demo model's 576-wide layers end in half blocks of 128), loads it as bulkgen does, and compares
its teacher-forced next-token distributions over fp8_accuracy.py's texts with the unquantized
model's, beside the same weights quantized once, per row, at load (--quantization fp8). Both
quantize activations per token alike, and on the CPU _scaled_mm sums exactly: what differs is
the weights' second rounding alone. Then the weights' rounding without any activation rounding:
float32 checkpoints of the weights as each scheme leaves them (per row; per block, what a GEMM
taking block scales would multiply; per block then per row, ours). One JSON line per mode, the
measures of fp8_accuracy.py.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from bench_commit import git_commit
from fp8_accuracy import TEXTS
from safetensors.torch import load_file, save_file

from bulkgen.model.attention import get_backend
from bulkgen.model.config import ModelConfig
from bulkgen.model.fp8 import FP8, FP8_MAX, quantize_weight
from bulkgen.model.fp8_scales import dequantize_blocks, requantize_blocks
from bulkgen.model.loader import load_model

CPU = torch.device("cpu")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_blockwise(src: Path, dst: Path, block: tuple[int, int]) -> Path:
    """src's projections as float8_e4m3fn with one scale per block (absmax / 448)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    rows, cols = block
    state = load_file(src / "model.safetensors")
    for name in [n for n in state if n.endswith(".weight") and n.split(".")[-2] in PROJECTIONS]:
        w = state[name].float()
        n, k = w.shape
        padded = torch.zeros(-(-n // rows) * rows, -(-k // cols) * cols)
        padded[:n, :k] = w
        tiles = padded.view(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
        scales = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
        full = scales.repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]
        state[name] = (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        state[name.removesuffix("weight") + "weight_scale_inv"] = scales
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [rows, cols],
    }
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def write_rounded(src: Path, blockwise: Path, dst: Path, how: str) -> Path:
    """src with each projection's weights as `how` rounds them, dequantized to float32: "row"
    (quantize_weight), "block" (the block-wise checkpoint's), "block-row" (requantize_blocks)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state, fp8 = load_file(src / "model.safetensors"), load_file(blockwise / "model.safetensors")
    block = tuple(json.loads((blockwise / "config.json").read_text())["quantization_config"][
        "weight_block_size"])  # fmt: skip
    for name in [n for n in state if n.endswith(".weight") and n.split(".")[-2] in PROJECTIONS]:
        if how == "row":
            q, scale = quantize_weight(state[name])
        else:
            grid = fp8[name.removesuffix("weight") + "weight_scale_inv"]
            if how == "block":
                state[name] = dequantize_blocks(fp8[name], grid, block, name)
                continue
            q, scale = requantize_blocks(fp8[name], grid, block, name)
        state[name] = q.float() * scale[:, None]
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@torch.inference_mode()
def teacher_forced_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log-softmax of every position's next-token logits [T, vocab]: one prefill over a cache
    of its own."""
    cfg, T, size = model.cfg, len(ids), 16
    blocks = -(-T // size)
    shape = (blocks, size, cfg.num_kv_heads, cfg.head_dim)
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    meta = model.attention.metadata(
        torch.arange(T),
        torch.tensor([0, T], dtype=torch.int32),
        torch.tensor([T], dtype=torch.int32),
        torch.arange(blocks, dtype=torch.int32)[None],
        [T],
        [T],
    )
    hidden = model(torch.tensor(ids), torch.arange(T), meta, kv)
    return torch.log_softmax(model.compute_logits(hidden).float(), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model folder or an alias")
    ap.add_argument("--block", default="128,128", help="the checkpoint's block: rows,columns")
    args = ap.parse_args()
    from bulkgen.engine.model_files import model_dir
    from bulkgen.text.tokenizer import load_tokenizer

    block = tuple(int(v) for v in args.block.split(","))
    folder = Path(model_dir(args.model))
    texts = [load_tokenizer(str(folder))(t)["input_ids"][:512] for t in TEXTS]
    backend = get_backend("torch", CPU)

    def load(path: Path, quantization: str | None = None):
        cfg = ModelConfig.from_dir(path)
        return load_model(path, cfg, backend, torch.float32, CPU, quantization=quantization)

    baseline = [teacher_forced_logprobs(load(folder), ids) for ids in texts]
    with tempfile.TemporaryDirectory() as tmp:
        blockwise = write_blockwise(folder, Path(tmp) / "blockwise", block)
        name = f"block-{block[0]}x{block[1]}"
        modes = [("per-row-at-load", lambda: load(folder, "fp8"))]
        modes.append((f"{name}-requantized", lambda: load(blockwise)))
        for how, label in (("row", "per-row"), ("block", name), ("block-row", f"{name}-per-row")):
            rounded = Path(tmp) / how
            modes.append((f"weights-only-{label}", lambda h=how, r=rounded: load(
                write_rounded(folder, blockwise, r, h))))  # fmt: skip
        for mode, build in modes:
            model = build()
            agree = kl = positions = 0.0
            for ids, ref in zip(texts, baseline, strict=True):
                lp = teacher_forced_logprobs(model, ids)
                agree += (lp.argmax(-1) == ref.argmax(-1)).sum().item()
                kl += (ref.exp() * (ref - lp)).sum(-1).clamp(min=0).sum().item()
                positions += len(ids)
            line = {
                "mode": mode,
                "model": args.model,
                "device": "cpu",
                "dtype": "float32",
                "texts": len(texts),
                "positions": int(positions),
                "top1_agreement": round(agree / positions, 4),
                "mean_kl": round(kl / positions, 5),
                "git_commit": git_commit(),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
