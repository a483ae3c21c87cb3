"""The engine with FP8 weights on an FP8 GPU (Ada/Hopper): CUDA-graph decode, the 8B shape, and
what stats.json says (GPU only; the arithmetic is checked on the CPU in test_fp8*.py)."""

from __future__ import annotations

import json

import pytest
import torch

from bulkgen import LLM, SamplingParams
from bulkgen.config import EngineConfig
from bulkgen.engine.engine import Engine
from bulkgen.model.fp8 import FP8, Fp8Linear
from bulkgen.model.shapes import LLAMA3_8B

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
        reason="needs a CUDA GPU with FP8 (compute capability 8.9+)",
    ),
]


def test_fp8_engine_decodes_in_cuda_graphs_as_it_does_eagerly(tiny_model_dir):
    from test_engine import PROMPTS, encode_all

    ids = encode_all(tiny_model_dir, PROMPTS)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    kw = dict(device="cuda", dtype="bfloat16", quantization="fp8", max_num_seqs=16)
    graphs = LLM(str(tiny_model_dir), **kw)
    assert graphs.engine.runner.graphs is not None, "decode steps must replay CUDA graphs"
    qkv = graphs.engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, Fp8Linear) and qkv.weight.dtype == FP8
    out_graphs = graphs.generate(ids, params)
    assert graphs.engine.runner.graph_steps > 0
    out_eager = LLM(str(tiny_model_dir), cuda_graphs=False, **kw).generate(ids, params)
    assert all(len(o.token_ids) == 24 for o in out_graphs)
    # Padded graph buckets may pick other GEMM algorithms: a rare near-tie may round apart.
    same = sum(a.token_ids == b.token_ids for a, b in zip(out_graphs, out_eager, strict=True))
    assert same >= len(ids) - 2
    quant = graphs.engine.stats["quantization"]
    assert quant["method"] == "fp8" and quant["source"] == "quantized at load"


def test_fp8_on_the_llama3_8b_shape_halves_the_weights_and_async_equals_sync():
    cfg = EngineConfig(
        model="llama3-8b-dummy",
        load_format="dummy",
        quantization="fp8",
        max_model_len=4096,
        prefix_cache=False,
    )
    engine = Engine(cfg, model_config=dict(LLAMA3_8B))
    model = engine.runner.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # bf16: 16.06 GB. FP8 projections (6.98 G params) plus bf16 embeddings and lm_head (2.1 GB).
    assert 8.9e9 < weight_bytes < 9.3e9
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(1000, 120000, (int(n),), generator=gen).tolist()
        for n in torch.randint(16, 512, (64,), generator=gen)
    ]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    results = []
    for async_loop in (True, False):
        engine.async_loop = async_loop
        for i, p in enumerate(prompts):
            engine.add(f"{async_loop}-{i}", p, params)
        outs = {}
        while engine.has_unfinished():
            outs.update({o.request_id: o.token_ids for o in engine.step()})
        results.append([outs[f"{async_loop}-{i}"] for i in range(len(prompts))])
    assert all(len(t) == 32 for t in results[0])
    assert results[0] == results[1]
    assert engine.runner.graph_steps > 0


def test_bulkgen_run_with_quantization_fp8_records_it_in_stats_json(tmp_path, tiny_model_dir):
    from click.testing import CliRunner

    from bulkgen.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(8)))
    out = tmp_path / "out"
    args = ["run", prompts, "-m", tiny_model_dir, "-o", out, "--quantization", "fp8"]
    result = CliRunner().invoke(main, [str(a) for a in [*args, "--max-tokens", "8"]])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rows"] == 8 and stats["completion_tokens"] > 0
    assert stats["quantization"]["source"] == "quantized at load"
    assert stats["quantization"]["weights"].startswith("float8_e4m3fn")


@pytest.mark.parametrize(
    "kind, static, block",
    [
        ("compressed-tensors", False, None),
        ("compressed-tensors", True, None),
        ("fp8", False, (16, 16)),
    ],
)
def test_an_fp8_checkpoint_runs_in_cuda_graphs_close_to_its_bf16_source(
    tmp_path, kind, static, block
):
    """Per-tensor scales, dynamic or static activations, and block-wise scales (re-quantized per
    row at load, on the GPU here)."""
    from fp8_checkpoints import IDS, build_source, calibrate, write_fp8

    source = build_source(tmp_path / "source")
    absmax = calibrate(source) if static else None
    strategy = "block" if block else "tensor"
    fp8_dir = write_fp8(source, tmp_path / "fp8", kind, strategy, absmax, block=block)
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)
    kw = dict(device="cuda", dtype="bfloat16")
    fp8 = LLM(str(fp8_dir), **kw)
    quantization = fp8.engine.stats["quantization"]
    assert quantization["source"] == f"checkpoint ({kind})"
    assert ("block scales" in quantization["weights"]) == (block is not None)
    prompts = [IDS[: 8 + i] for i in range(16)]
    got, ref = fp8.generate(prompts, params), LLM(str(source), **kw).generate(prompts, params)
    # FP8 costs accuracy, and this small random model's next-token logits lie close together
    # (on the CPU in float32 12-14 of 16 argmaxes stay): FP8's pick is among bf16's top 5.
    pairs = list(zip(got, ref, strict=True))
    assert sum(a.token_ids[0] in {t for t, _ in b.top_logprobs[0]} for a, b in pairs) >= 15
    assert sum(a.token_ids == b.token_ids for a, b in pairs) >= 8
