"""FP8 asked for where it cannot run (the CPU here) is one clear error, before any work: from
`bulkgen run --quantization fp8`, a recipe's `quantization: fp8`, an FP8 checkpoint, and
LLM(..., quantization="fp8"). And the value is checked like any other option."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from click.testing import CliRunner

from bulkgen import LLM
from bulkgen.cli import main
from bulkgen.config import EngineConfig

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's refusal")


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    return path


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_run_with_quantization_fp8_on_the_cpu_is_one_error_line_and_no_output(
    tmp_path, prompts, tiny_model_dir
):
    out = tmp_path / "out"
    result = bulkgen("run", prompts, "-m", tiny_model_dir, "-o", out, "--quantization", "fp8")
    line = one_error_line(result)
    assert "FP8 needs a CUDA GPU" in line and "not the CPU" in line
    assert not list(out.glob("part-*")) and not (out / "stats.json").exists()


def test_a_recipe_field_asks_for_fp8_as_the_flag_does(tmp_path, prompts, tiny_model_dir):
    recipe = tmp_path / "job.yaml"
    fields = {"inputs": str(prompts), "out": str(tmp_path / "out"), "model": str(tiny_model_dir)}
    recipe.write_text(yaml.safe_dump(fields | {"quantization": "fp8"}))
    assert "FP8 needs a CUDA GPU" in one_error_line(bulkgen("run", "--recipe", recipe))


def test_an_fp8_checkpoint_on_the_cpu_is_one_error_line(tmp_path, prompts, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (model / "config.json").write_text(json.dumps(config))
    result = bulkgen("run", prompts, "-m", model, "-o", tmp_path / "out")
    assert "FP8 needs a CUDA GPU" in one_error_line(result)


def test_an_unsupported_checkpoint_scheme_is_one_error_line(tmp_path, prompts, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128]}
    (model / "config.json").write_text(json.dumps(config))
    line = one_error_line(bulkgen("run", prompts, "-m", model, "-o", tmp_path / "out"))
    assert "block-wise weight scales" in line and "[128]" in line


def test_llm_with_quantization_fp8_on_the_cpu_raises_before_loading(tiny_model_dir, monkeypatch):
    import bulkgen.engine.engine as engine

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(engine, "load_model", no_load)
    with pytest.raises(ValueError, match="FP8 needs a CUDA GPU"):
        LLM(str(tiny_model_dir), device="cpu", quantization="fp8")


def test_an_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="quantization must be fp8"):
        EngineConfig(model="m", quantization="int4")
    result = bulkgen("run", "x.jsonl", "-o", "out", "--quantization", "int4")
    assert result.exit_code == 2 and "Invalid value for '--quantization'" in result.output


def test_run_help_explains_the_quantization_flag():
    result = bulkgen("run", "--help")
    assert result.exit_code == 0
    assert "--quantization [fp8]" in result.output and "Ada or" in result.output
