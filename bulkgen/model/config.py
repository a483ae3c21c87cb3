"""ModelConfig: the Llama-family shape read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Architectures this implementation covers, and the flags that tell their variants apart.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple | None  # frozen items of the rope_scaling dict, or None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3
    torch_dtype: str | None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else ""
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"model architecture {arch or '(none given)'!r} is not supported; bulkgen runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        rope_params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or None
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None and rope_params:
            rope_theta = rope_params.get("rope_theta")
        scaling = None
        if rope_params:
            kind = rope_params.get("rope_type") or rope_params.get("type") or "default"
            if kind not in ("default", "llama3"):
                raise ValueError(f"rope scaling type {kind!r} is not supported (default, llama3)")
            if kind == "llama3":
                keys = ("factor", "low_freq_factor", "high_freq_factor")
                keys += ("original_max_position_embeddings",)
                scaling = tuple((k, float(rope_params[k])) for k in keys)
        if cfg.get("sliding_window") and cfg.get("use_sliding_window", arch != "Qwen2ForCausalLM"):
            if cfg["sliding_window"] < cfg.get("max_position_embeddings", 0):
                raise ValueError("sliding-window attention is not supported yet")
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"{model_dir}: no config.json; is this a Hugging Face model folder?")
        return cls.from_dict(json.loads(path.read_text()))
