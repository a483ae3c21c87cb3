"""fp8_fast_accum (--fp8-fast-accum, the default with FP8 weights): FP8 GEMMs sum K in the tensor
cores' own accumulator, as cuBLASLt's use_fast_accum and vLLM's and TensorRT-LLM's FP8 GEMMs do.
The arithmetic only the GPU has (its narrower accumulator) is for scripts/fp8_accuracy.py's
fp8-weights and fp8-weights-exact modes on the H200; here: the setting reaches both GEMMs
(cuBLASLt's flag, the Triton kernel's constexpr; the sm_90 compile check in test_fp8_gemm.py
shows the e4m3 MMAs then keep their sums), results stay the reference's where the arithmetic is
exact (the interpreter, the CPU), it is on by default only with FP8 weights, and asking for it
without them is an error.
"""

from __future__ import annotations

import json
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import yaml  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from fp8_checkpoints import IDS, load, logits  # noqa: E402
from test_fp8 import needs_fp8_gpu  # noqa: E402
from test_fp8_gemm import SHAPES_8B, assert_rounds_like_the_reference, operands  # noqa: E402

from bulkgen import LLM  # noqa: E402
from bulkgen.cli import main  # noqa: E402
from bulkgen.config import EngineConfig  # noqa: E402
from bulkgen.model import fp8_gemm_table  # noqa: E402
from bulkgen.model.fp8 import Fp8Linear, scaled_mm_reference  # noqa: E402
from bulkgen.model.fp8_gemm import CANDIDATES, fp8_gemm, tile_counters_for  # noqa: E402
from bulkgen.model.loader import load_model  # noqa: E402


@pytest.mark.parametrize("name", ["m64n64k128s2", "m16n64k128s4t", "m16n64k128s4tf"])
def test_the_triton_gemm_with_fast_accumulation_computes_the_same_product(name):
    """Under the interpreter the sums are exact either way: the constexpr is plumbed through
    every launch kind (plain, swapped, adding its own splits)."""
    config = CANDIDATES[name]
    xq, x_scale, wq, w_scale = operands(37, 80, 300)
    counters = tile_counters_for(37, 80, config, xq.device)
    out = fp8_gemm(xq, x_scale, wq, w_scale, config, tile_counters=counters, fast_accum=True)
    assert_rounds_like_the_reference(out, scaled_mm_reference(xq, x_scale, wq, w_scale))


@pytest.mark.parametrize("fast", [False, True])
def test_fp8_matmul_hands_the_setting_to_cublaslt(monkeypatch, fast):
    seen = []
    real = torch._scaled_mm

    def spy(*args, **kwargs):
        seen.append(kwargs.get("use_fast_accum"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    monkeypatch.setattr(fp8_gemm_table, "gemm_choice", lambda n, k, m: None)  # cuBLASLt's
    xq, x_scale, wq, w_scale = operands(8, 64, 128)
    out = fp8_gemm_table.fp8_matmul(xq, x_scale, wq, w_scale, fast_accum=fast)
    assert seen == [fast]
    assert_rounds_like_the_reference(out, scaled_mm_reference(xq, x_scale, wq, w_scale))


def test_the_loader_sets_every_fp8_projection_and_the_logits_stay(tiny_model_dir, monkeypatch):
    precise = load(tiny_model_dir, quantization="fp8")
    cfg, backend = precise.cfg, precise.attention
    fast = load_model(tiny_model_dir, cfg, backend, torch.float32, torch.device("cpu"),
                      quantization="fp8", fp8_fast_accum=True)  # fmt: skip
    fp8 = [m for m in fast.modules() if isinstance(m, Fp8Linear)]
    assert len(fp8) == 4 * cfg.num_layers and all(m.fast_accum for m in fp8)
    assert not any(m.fast_accum for m in precise.modules() if isinstance(m, Fp8Linear))
    seen = []
    real = fp8_gemm_table.fp8_matmul
    monkeypatch.setattr(
        fp8_gemm_table, "fp8_matmul", lambda *a: seen.append(a[-1]) or real(*a)
    )  # what Fp8Linear.forward passes on
    assert torch.equal(logits(fast, IDS), logits(precise, IDS))  # the CPU sums exactly
    assert seen and all(seen[: len(seen) // 2]) and not any(seen[len(seen) // 2 :])


def test_without_fp8_weights_it_is_an_error_before_loading(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="fp8_fast_accum .* and this model has none"):
        LLM(str(tiny_model_dir), device="cpu", fp8_fast_accum=True)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    args = ["run", str(inp), "-m", str(tiny_model_dir), "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(main, [*args, "--fp8-fast-accum"])
    assert result.exit_code == 1 and "--fp8-fast-accum" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_the_flag_the_recipe_field_and_the_config_agree(tmp_path):
    from bulkgen.cli import run
    from bulkgen.recipes import load_recipe
    from bulkgen.run_config import RunConfig

    assert EngineConfig(model="-").fp8_fast_accum is None, "unset: the weights decide"
    for value in (True, False):
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({"fp8_fast_accum": value}))
        assert load_recipe(tmp_path / "job.yaml", run).options["fp8_fast_accum"] is value
        config = RunConfig(inputs=("x.jsonl",), out="o", model="m", fp8_fast_accum=value)
        assert config.engine_config("m").fp8_fast_accum is value
    assert (
        RunConfig(inputs=("x.jsonl",), out="o", model="m").engine_config("m").fp8_fast_accum is None
    )
    help_text = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--fp8-fast-accum / --no-fp8-fast-accum" in help_text
    with pytest.raises(ValueError, match="fp8_fast_accum must be true, false or unset"):
        EngineConfig(model="-", fp8_fast_accum="yes")


def test_it_is_on_by_default_with_fp8_weights_only():
    from bulkgen.model.fp8 import resolve_fast_accum

    fp8 = {"method": "fp8", "source": "quantized at load"}
    assert resolve_fast_accum(None, fp8) is True
    assert resolve_fast_accum(False, fp8) is False, "--no-fp8-fast-accum sums exactly"
    assert resolve_fast_accum(True, fp8) is True
    assert resolve_fast_accum(None, None) is False and resolve_fast_accum(False, None) is False
    with pytest.raises(ValueError, match="this model has none"):
        resolve_fast_accum(True, None)


def test_a_16_bit_model_runs_and_reports_it_off(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32")
    assert llm.engine.stats["fp8_fast_accum"] is False
    llm = LLM(str(tiny_model_dir), device="cpu", dtype="float32", fp8_fast_accum=False)
    assert llm.engine.stats["fp8_fast_accum"] is False


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("m", [32, 512])
def test_gpu_fast_accumulation_stays_near_the_exact_product_on_the_8b_shapes(m):
    """The tensor cores' narrower sums (about 14 bits within an MMA chain, DeepSeek-V3
    measured) move each 8B projection's output by a small fraction of its norm, through the
    kernel the table chose (Triton at 32 rows, cuBLASLt at 512); accuracy on text is
    fp8_accuracy.py's to say."""
    for name, (n, k) in SHAPES_8B.items():
        xq, x_scale, wq, w_scale = operands(m, n, k)
        counters = torch.zeros(
            fp8_gemm_table.tile_counters_needed(n, k), dtype=torch.int32, device=xq.device
        )
        exact = scaled_mm_reference(xq, x_scale, wq, w_scale)
        fast = fp8_gemm_table.fp8_matmul(xq, x_scale, wq, w_scale, counters, fast_accum=True)
        error = ((fast.float() - exact).norm() / exact.norm()).item()
        assert error < 1e-2, (name, error)
