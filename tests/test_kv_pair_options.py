"""fp8_kv_pair_first_block (--fp8-kv-pair-first-block, off unless asked for): each
sequence's first KV block is kept at about 16-bit precision in a partner block
(model/attention/kv_pairs.py). Here: how the setting is given (flag, recipe field, RunConfig,
LLM argument) and resolved: off by default, on only with an fp8 cache, and asking for it with
another cache is one line naming the flag. What the pairs store and read is the attention
tests' to say.
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from bulkgen import LLM
from bulkgen.cli import main
from bulkgen.config import EngineConfig
from bulkgen.model.attention.kv_pairs import resolve_pair_first


def test_without_an_fp8_cache_it_is_an_error_before_loading(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="fp8_kv_pair_first_block"):
        LLM(str(tiny_model_dir), device="cpu", fp8_kv_pair_first_block=True)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    args = ["run", str(inp), "-m", str(tiny_model_dir), "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(main, [*args, "--fp8-kv-pair-first-block"])
    assert result.exit_code == 1 and "--fp8-kv-pair-first-block" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_the_flag_the_recipe_field_and_the_config_agree(tmp_path):
    from bulkgen.cli import run
    from bulkgen.recipes import load_recipe
    from bulkgen.run_config import RunConfig

    assert EngineConfig(model="-").fp8_kv_pair_first_block is None, "unset: the cache decides"
    for value in (True, False):
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({"fp8_kv_pair_first_block": value}))
        assert load_recipe(tmp_path / "job.yaml", run).options["fp8_kv_pair_first_block"] is value
        config = RunConfig(inputs=("x.jsonl",), out="o", model="m", fp8_kv_pair_first_block=value)
        assert config.engine_config("m").fp8_kv_pair_first_block is value
    unset = RunConfig(inputs=("x.jsonl",), out="o", model="m").engine_config("m")
    assert unset.fp8_kv_pair_first_block is None
    help_text = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--fp8-kv-pair-first-block / --no-fp8-kv-pair-first-block" in help_text
    with pytest.raises(ValueError, match="fp8_kv_pair_first_block must be true, false or unset"):
        EngineConfig(model="-", fp8_kv_pair_first_block="yes")


def test_it_is_on_by_default_with_an_fp8_cache_only():
    assert resolve_pair_first(None, "fp8") is False, "off unless asked for"
    assert resolve_pair_first(None, "auto") is False and resolve_pair_first(None, "int8") is False
    assert resolve_pair_first(False, "fp8") is False, "plain e4m3"
    assert resolve_pair_first(True, "fp8") is True
    for other in ("auto", "int8"):
        with pytest.raises(ValueError, match="--kv-cache-dtype fp8"):
            resolve_pair_first(True, other)


def test_a_16_bit_cache_runs_and_reports_it_off(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32")
    assert llm.engine.stats["fp8_kv_pair_first_block"] is False
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32", fp8_kv_pair_first_block=False)
    assert llm.engine.stats["fp8_kv_pair_first_block"] is False
