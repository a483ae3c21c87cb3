"""A tiny Llama GGUF written the way llama.cpp writes one (q/k permuted, its tensor names and
tokenizer metadata), from random Hugging Face-layout weights: what the GGUF tests convert."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# hidden 16, 4 heads of 4 (2 KV heads), 2 layers: small, but GQA so q and k unpermute differently.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 16, 4, 2, 4, 24, 2


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, the reference we must invert."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tiny_vocab() -> list[str]:
    from tokenizers import pre_tokenizers

    return SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(m) for m in MERGES]


def hf_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random Llama weights in Hugging Face layout; matrices float16, norms float32."""
    rng = np.random.default_rng(seed)
    vocab = len(tiny_vocab())

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)).astype(np.float16)

    weights = {"model.embed_tokens.weight": mat(vocab, HIDDEN)}
    weights["model.norm.weight"] = rng.standard_normal(HIDDEN).astype(np.float32)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = rng.standard_normal(HIDDEN).astype(np.float32)
        weights[p + "post_attention_layernorm.weight"] = rng.standard_normal(HIDDEN).astype(
            np.float32
        )
        weights[p + "self_attn.q_proj.weight"] = mat(HEADS * HEAD_DIM, HIDDEN)
        weights[p + "self_attn.k_proj.weight"] = mat(KV_HEADS * HEAD_DIM, HIDDEN)
        weights[p + "self_attn.v_proj.weight"] = mat(KV_HEADS * HEAD_DIM, HIDDEN)
        weights[p + "self_attn.o_proj.weight"] = mat(HIDDEN, HEADS * HEAD_DIM)
        weights[p + "mlp.gate_proj.weight"] = mat(INTER, HIDDEN)
        weights[p + "mlp.up_proj.weight"] = mat(INTER, HIDDEN)
        weights[p + "mlp.down_proj.weight"] = mat(HIDDEN, INTER)
    return weights


def write_tiny_gguf(path: Path, weights: dict[str, np.ndarray]) -> None:
    """What llama.cpp's converter would write for these weights: renamed, q/k permuted."""
    import gguf

    tokens = tiny_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(12345.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(1)  # <|im_start|>: wrong for chat, as DESIGN.md says of the demo model
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for name, value in weights.items():
        if name.endswith("q_proj.weight"):
            value = llama_cpp_permute(value, HEADS)
        elif name.endswith("k_proj.weight"):
            value = llama_cpp_permute(value, KV_HEADS)
        w.add_tensor(gguf_name(name), value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


GGUF_PARTS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's name for a Hugging Face Llama tensor."""
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    _, _, index, part = hf_name.removesuffix(".weight").split(".", 3)
    return f"blk.{index}.{GGUF_PARTS[part]}.weight"
