"""Mistakes a user can fix end in one line and exit status 1, never a traceback, and write
nothing (found by fuzzing: each of these ended in a traceback, or blocked, before)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from bulkgen.cli import main


@pytest.fixture
def job(tmp_path, tiny_model_dir):
    """A copy of the tiny model to damage, and a prompts file."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Hello"}\n{"id": "b", "prompt": "World"}\n')
    return model, prompts, tmp_path / "out"


def one_line(*args) -> str:
    result = CliRunner().invoke(main, ["run", *map(str, args), "--max-tokens", "2"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


def test_a_truncated_weights_file_is_one_line(job):
    model, prompts, out = job
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    assert "model.safetensors cannot be read (" in one_line(prompts, "-m", model, "-o", out)
    assert not out.exists()


def test_a_weight_of_another_shape_is_one_line_naming_it(job):
    model, prompts, out = job
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    rows, cols = tensors[name].shape
    tensors[name] = torch.zeros(rows // 2, cols)  # copy_ would have broadcast a single row
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    line = one_line(prompts, "-m", model, "-o", out)
    assert f"is ({rows // 2}, {cols}) in the checkpoint" in line and "qkv_proj.weight" in line


@pytest.mark.parametrize("device", ["tpu", "cpu:1"])
def test_a_device_torch_does_not_know_is_one_line(job, device):
    model, prompts, out = job
    line = one_line(prompts, "-m", model, "-o", out, "--device", device)
    assert f"device must be cuda, cuda:N, cpu or auto, got '{device}'" in line


def test_prompt_ids_past_the_models_vocabulary_are_error_records(job):
    # A model with fewer embedding rows than its tokenizer has ids: the rows whose prompts hold
    # such ids fail alone (the embedding's IndexError ended the job).
    model, prompts, out = job
    config = json.loads((model / "config.json").read_text())
    tensors = load_file(model / "model.safetensors")
    small = 260
    for name in tensors:
        if "embed_tokens" in name or "lm_head" in name:
            tensors[name] = tensors[name][:small].contiguous()
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": small}))
    ids = [[5, 6], [5, small + 3]]
    prompts.write_text(
        "".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(ids))
    )
    result = CliRunner().invoke(main, ["run", str(prompts), "-m", str(model), "-o", str(out),
                                       "--max-tokens", "2", "--format", "jsonl"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {
        r["id"]: r for r in map(json.loads, (out / "part-00000.jsonl").read_text().splitlines())
    }
    assert rows["0"]["error"] is None
    assert f"prompt token id {small + 3} is outside the vocabulary" in rows["1"]["error"]


def test_a_fifo_is_refused_in_one_line_named_or_matched(job):
    _, prompts, out = job
    folder = prompts.parent / "in"
    folder.mkdir()
    os.mkfifo(folder / "f.jsonl")
    named = one_line(folder / "f.jsonl", "-m", "unused", "-o", out)
    assert "is not a regular file or a folder" in named
    matched = one_line(f"{folder}/*.jsonl", "-m", "unused", "-o", out)  # it blocked the run
    assert "files match" in matched


def test_a_config_json_that_is_not_json_is_named_as_such(job):
    model, prompts, out = job
    (model / "config.json").write_text('{"vocab_size": 384,\n')  # cut short
    line = one_line(prompts, "-m", model, "-o", out)
    assert "its config.json is not JSON" in line  # it blamed the tokenizer


def test_an_unknown_architecture_is_one_line_before_the_tokenizer_loads(job):
    model, prompts, out = job
    config = json.loads((model / "config.json").read_text())
    config.update(architectures=["FooForCausalLM"], model_type="foo")
    (model / "config.json").write_text(json.dumps(config))
    line = one_line(prompts, "-m", model, "-o", out)  # a transformers warning line came first
    assert "model architecture 'FooForCausalLM' is not supported" in line


def test_an_empty_out_is_a_usage_error_not_the_current_folder(job):
    _, prompts, _ = job
    result = CliRunner().invoke(main, ["run", str(prompts), "-m", "unused", "-o", ""])
    assert result.exit_code == 2 and "--out is empty" in result.output
