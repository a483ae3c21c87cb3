"""The FP8 KV cache (--kv-cache-dtype fp8): arithmetic, capacity, the refusal where the hardware
has no FP8, and whole runs through the engine and `bulkgen run` (the scales a checkpoint brings:
test_kv_fp8_scales.py).

The CPU runs the fp8 path with the torch backend once `fp8_supported` is replaced (`allow_fp8`,
conftest.py): a user's run there is refused, which is tested as such.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from bulkgen import LLM, SamplingParams
from bulkgen.cli import main
from bulkgen.config import EngineConfig
from bulkgen.engine import kv_sizing
from bulkgen.engine.engine import Engine
from bulkgen.engine.runner import kv_bytes_per_block
from bulkgen.model.attention import kv_fp8, torch_backend
from bulkgen.model.attention.kv_fp8 import (
    FP8_DTYPE,
    check_kv_cache_dtype,
    dequantize,
    quantize,
)
from bulkgen.model.config import ModelConfig
from bulkgen.run_config import RunConfig

CPU = torch.device("cpu")


def greedy(max_tokens=12):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


# ---- the arithmetic ---------------------------------------------------------------------------


def test_quantize_divides_by_the_scale_and_rounds_to_e4m3():
    x = torch.tensor([0.3, -1.7, 10.0, 0.0, 3.3e-3])
    q = quantize(x, 0.5)
    assert q.dtype == FP8_DTYPE
    assert q.float().tolist() == [0.625, -3.5, 20.0, 0.0, 0.005859375]  # x / 0.5, 3 mantissa bits
    assert dequantize(q, 0.5).tolist() == [0.3125, -1.75, 10.0, 0.0, 0.0029296875]


def test_quantize_saturates_at_448_times_the_scale_instead_of_overflowing():
    q = quantize(torch.tensor([1e4, -1e4, 900.0, float("inf")]), 2.0)
    assert q.float().tolist() == [448.0, -448.0, 448.0, 448.0]


def test_round_trip_error_is_at_most_half_an_e4m3_step():
    x = torch.randn(100_000) * 30
    for scale in (1.0, 0.07, 3.0):
        back = dequantize(quantize(x, scale), scale)
        # In e4m3's normal range (subnormals have a fixed step; past 448 it saturates).
        normal = (x.abs() / scale >= 2**-6) & (x.abs() / scale <= 448)
        rel = ((back - x).abs() / x.abs())[normal]
        assert rel.max() <= 2**-4 + 1e-6  # 3 mantissa bits: half a step is 1/16


def test_fp8_cache_holds_twice_the_tokens_of_bf16_and_four_times_fp32():
    mcfg = ModelConfig.from_dict(_llama_config())
    fp8 = kv_bytes_per_block(mcfg, 16, FP8_DTYPE)
    assert kv_bytes_per_block(mcfg, 16, torch.bfloat16) == 2 * fp8
    assert kv_bytes_per_block(mcfg, 16, torch.float32) == 4 * fp8
    assert fp8 == 2 * 32 * 16 * 8 * 128  # K and V, 32 layers, 16 tokens, 8 heads of 128, 1 byte


# ---- where fp8 is refused -------------------------------------------------------------------


def test_fp8_needs_compute_capability_8_9(monkeypatch):
    for capability, supported in [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, c=capability: c)
        assert kv_fp8.fp8_supported(torch.device("cuda", 0)) is supported
    assert not kv_fp8.fp8_supported(CPU)


def test_fp8_on_an_older_gpu_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError) as e:
        check_kv_cache_dtype("fp8", torch.device("cuda", 0))
    message = str(e.value)
    assert "\n" not in message
    assert "NVIDIA A100-SXM4-80GB (compute capability 8.0)" in message
    assert "--kv-cache-dtype auto" in message


def test_fp8_engine_on_the_cpu_is_refused_before_the_model_is_looked_at():
    # The model folder does not exist: the refusal comes first, so nothing was loaded.
    cfg = EngineConfig(model="/no/such/model", device="cpu", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="needs a GPU with FP8 support.*on the CPU"):
        Engine(cfg)


def test_auto_is_allowed_everywhere_and_other_names_are_refused():
    check_kv_cache_dtype("auto", CPU)
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto, fp8 or int8"):
        EngineConfig(model="m", kv_cache_dtype="int4")


def test_bulkgen_run_with_fp8_on_the_cpu_is_one_error_line(tmp_path, tiny_model_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello"}) + "\n")
    out = tmp_path / "out"
    args = ["run", prompts, "-m", tiny_model_dir, "-o", out, "--device", "cpu",
            "--kv-cache-dtype", "fp8", "--max-tokens", "2"]  # fmt: skip
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert lines[0].startswith(f"error: cannot load model {tiny_model_dir}: --kv-cache-dtype fp8")
    assert "needs a GPU with FP8 support (compute capability 8.9 or newer" in lines[0]
    assert not list(out.glob("part-*"))


# ---- capacity and whole runs (CPU, torch backend) ---------------------------------------------


def test_the_same_memory_holds_four_times_the_fp32_blocks(tiny_model_dir, allow_fp8, monkeypatch):
    mcfg = ModelConfig.from_dir(tiny_model_dir)
    fp32_block = kv_bytes_per_block(mcfg, 16, torch.float32)
    monkeypatch.setattr(kv_sizing, "CPU_KV_BUDGET", 10 * fp32_block)
    plain = LLM(str(tiny_model_dir), dtype="float32", device="cpu").engine
    fp8 = LLM(str(tiny_model_dir), dtype="float32", device="cpu", kv_cache_dtype="fp8").engine
    assert plain.stats["kv_blocks"] == 10 and fp8.stats["kv_blocks"] == 40
    assert fp8.runner.kv_cache.dtype == FP8_DTYPE
    assert fp8.runner.kv_cache.nbytes == plain.runner.kv_cache.nbytes
    assert (plain.stats["kv_cache_dtype"], fp8.stats["kv_cache_dtype"]) == (
        "float32",
        "float8_e4m3fn",
    )
    assert (plain.stats["kv_capacity_tokens"], fp8.stats["kv_capacity_tokens"]) == (160, 640)


def test_fp8_run_equals_a_full_precision_run_of_fp8_rounded_keys_and_values(
    tiny_model_dir, allow_fp8, monkeypatch
):
    """Everything but the storage is the same: the engine with an fp8 cache generates what an
    fp32 cache holding the same rounded values generates, token for token, through chunked
    prefill, prefix-cache hits and preemption (a cache of 24 blocks of 4), with scales not 1."""
    from test_engine import PROMPTS, encode_all

    ids = encode_all(tiny_model_dir, PROMPTS)
    ids += [ids[2] + [7, 8], ids[2] + [9]]  # share a cached prefix with prompt 2
    scales = {0: (0.5, 2.0), 1: (3.0, 0.25)}
    kw = dict(
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=24,
        max_batch_tokens=16,
        output_reserve=0,
    )  # admission without a horizon: preemption happens
    # Plain e4m3 everywhere (paired first blocks: test_kv_pairs.py).
    fp8 = LLM(str(tiny_model_dir), kv_cache_dtype="fp8", fp8_kv_pair_first_block=False, **kw)
    real_write = torch_backend.write_kv

    def rounded_write(k, v, k_cache, v_cache, slots, k_scale=1.0, v_scale=1.0):
        k, v = dequantize(quantize(k, k_scale), k_scale), dequantize(quantize(v, v_scale), v_scale)
        real_write(k, v, k_cache, v_cache, slots)

    monkeypatch.setattr(torch_backend, "write_kv", rounded_write)
    rounded = LLM(str(tiny_model_dir), **kw)
    for llm in (fp8, rounded):
        for layer, (k_scale, v_scale) in scales.items():
            attention = llm.engine.runner.model.model.layers[layer].self_attn
            attention.k_scale, attention.v_scale = k_scale, v_scale
    out_fp8, out_rounded = fp8.generate(ids, greedy(30)), rounded.generate(ids, greedy(30))
    assert fp8.engine.scheduler.num_preemptions > 0
    assert fp8.engine.scheduler.num_cached_tokens > 0
    assert [o.token_ids for o in out_fp8] == [o.token_ids for o in out_rounded]


def test_kv_cache_dtype_is_a_flag_a_recipe_field_and_reaches_the_engine(tmp_path):
    from bulkgen.cli import run as run_command
    from bulkgen.recipes import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("kv_cache_dtype: fp8\n")
    assert load_recipe(recipe, run_command).options["kv_cache_dtype"] == "fp8"
    config = RunConfig(inputs=("a.jsonl",), out="o", model="m", kv_cache_dtype="fp8")
    assert config.engine_config("m").kv_cache_dtype == "fp8"
    result = CliRunner().invoke(main, ["run", "--help"])
    assert "--kv-cache-dtype [auto|fp8|int8]" in result.output


def test_stats_json_records_the_kv_dtype_and_capacity(tmp_path, tiny_model_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello"}) + "\n")
    out = tmp_path / "out"
    args = ["run", prompts, "-m", tiny_model_dir, "-o", out, "--device", "cpu",
            "--max-tokens", "2", "-q"]  # fmt: skip
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["kv_cache_dtype"] == "float32"  # auto: the model's dtype on the CPU
    assert stats["kv_capacity_tokens"] == stats["kv_blocks"] * stats["block_size"] > 0


# ---- GPU: the engine with Triton kernels and CUDA graphs --------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_fp8_kv_greedy_mostly_agrees_with_bf16_kv(tiny_model_dir):
    from test_engine import PROMPTS, encode_all

    ids = encode_all(tiny_model_dir, PROMPTS)
    kw = dict(dtype="bfloat16", device="cuda", max_num_seqs=16)
    bf16 = LLM(str(tiny_model_dir), **kw)
    fp8 = LLM(str(tiny_model_dir), kv_cache_dtype="fp8", **kw)
    assert fp8.engine.runner.graphs is not None, "decode steps must replay CUDA graphs"
    assert fp8.engine.stats["kv_cache_dtype"] == "float8_e4m3fn"
    a, b = bf16.generate(ids, greedy(8)), fp8.generate(ids, greedy(8))
    first = sum(x.token_ids[0] == y.token_ids[0] for x, y in zip(a, b, strict=True))
    # Random weights leave small logit gaps, so fp8 rounding flips some near-ties: most, not all.
    assert first >= 0.7 * len(ids), (first, [x.token_ids for x in a], [y.token_ids for y in b])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("v_slots_inner", [False, True])
def test_gpu_fp8_engine_matches_the_cpu_fp8_reference(
    tiny_model_dir, allow_fp8, monkeypatch, v_slots_inner, pairs
):
    """On the GPU with either value layout (kv_layout.py; the CPU's torch backend has rows),
    with and without paired first blocks (kv_pairs.py)."""
    from test_engine import PROMPTS, encode_all

    from bulkgen.model.attention import decode_tiling
    from bulkgen.model.attention.kv_layout import v_slots_inner as is_slots_inner

    monkeypatch.setattr(decode_tiling, "fp8_v_slots_inner", lambda: v_slots_inner)
    ids = encode_all(tiny_model_dir, PROMPTS)
    # Blocks of one size on both (the CPU's torch backend would take 16): the paired first
    # block (kv_pairs.py) then covers the same positions.
    block_size = 64 if v_slots_inner else 16
    kw = dict(dtype="float32", kv_cache_dtype="fp8", num_blocks=64, max_num_seqs=8)
    kw |= dict(block_size=block_size, fp8_kv_pair_first_block=pairs)
    llm = LLM(str(tiny_model_dir), device="cuda", **kw)
    assert is_slots_inner(llm.engine.runner.kv[0][1]) == v_slots_inner
    assert llm.engine.stats["fp8_kv_pair_first_block"] is pairs
    gpu = llm.generate(ids, greedy(16))
    cpu = LLM(str(tiny_model_dir), device="cpu", **kw).generate(ids, greedy(16))
    same = sum(a.token_ids == b.token_ids for a, b in zip(gpu, cpu, strict=True))
    assert same >= 8, "an fp32 key a few ulps apart may round to the other e4m3 value, rarely"


def _llama_config() -> dict:
    from bulkgen.model.shapes import LLAMA3_8B

    return dict(LLAMA3_8B)
