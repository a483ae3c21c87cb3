"""Model shapes for benchmarks and tests with dummy weights (no checkpoint needed)."""

from __future__ import annotations

from types import MappingProxyType

# Llama-3.1-8B: what DESIGN.md's roofline figures and scripts/bench.py are measured on.
LLAMA3_8B = MappingProxyType(
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
)

# Llama-3.1-70B: the shape issue 14's tensor-parallel benchmark runs (141 GB of bf16 weights).
LLAMA31_70B = MappingProxyType(
    {
        **LLAMA3_8B,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    }
)

SHAPES = MappingProxyType({"8b": LLAMA3_8B, "70b": LLAMA31_70B})
