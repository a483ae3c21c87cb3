"""--tensor-parallel 2 on two GPUs: NCCL, Triton attention and decode CUDA graphs that capture the
all-reduce and the logits' all-gather (GPU only; the lead runs these on nvidia-h200-x2)."""

from __future__ import annotations

import pytest
import torch

from bulkgen import LLM, SamplingParams
from bulkgen.config import EngineConfig
from bulkgen.engine.engine import Engine
from bulkgen.model.shapes import LLAMA3_8B

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def tokens(model_dir, **kwargs) -> tuple[list[list[int]], dict]:
    from test_engine import PROMPTS, encode_all

    llm = LLM(str(model_dir), dtype="float32", device="cuda", max_num_seqs=16, **kwargs)
    try:
        if kwargs.get("tensor_parallel", 1) > 1:
            assert llm.engine.runner.graphs is not None, "decode must replay CUDA graphs"
        outs = llm.generate(encode_all(model_dir, PROMPTS), GREEDY)
        return [o.token_ids for o in outs], llm.engine.stats
    finally:
        llm.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_two_gpus_give_the_greedy_tokens_of_one_with_graphs_replayed(tiny_models, arch):
    one, _ = tokens(tiny_models[arch])
    two, stats = tokens(tiny_models[arch], tensor_parallel=2)
    assert stats["decode_graph_steps"] > 0 and stats["tensor_parallel"] == 2
    same = sum(a == b for a, b in zip(one, two, strict=True))
    assert same >= len(one) - 1, "a rare fp32 near-tie may flip, never more"


def test_8b_shape_on_two_gpus_holds_half_the_weights_per_gpu():
    cfg = EngineConfig(
        model="llama3-8b-dummy",
        load_format="dummy",
        max_model_len=4096,
        tensor_parallel=2,
        num_blocks=256,
    )
    engine = Engine(cfg, model_config=dict(LLAMA3_8B))
    try:
        weights = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
        assert 7.5e9 < weights < 8.5e9  # 16.06 GB of bf16 weights over two ranks
        engine.add("0", list(range(100, 400)), SamplingParams(max_tokens=64, temperature=0.0))
        while engine.has_unfinished():
            engine.step()
        assert engine.runner.graph_steps > 0
    finally:
        engine.close()


@pytest.mark.parametrize("strategy, block", [("channel", None), ("block", (16, 16))])
def test_an_fp8_checkpoint_over_two_gpus_picks_what_one_gpu_does(tmp_path, strategy, block):
    """Each rank reads its slice of the FP8 weights and scales (fp8_checkpoint.scale_shard); a
    row-parallel rank quantizes its half of each activation row on its own, so the logits are
    not bit-equal to one GPU's: the pick must be among its top 5, and mostly the same."""
    from fp8_checkpoints import IDS, build_source, write_fp8

    kind = "fp8" if block else "compressed-tensors"
    fp8_dir = write_fp8(
        build_source(tmp_path / "source"), tmp_path / "fp8", kind, strategy, block=block
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)
    prompts = [IDS[: 8 + i] for i in range(16)]
    runs = []
    for tp in (1, 2):
        llm = LLM(str(fp8_dir), device="cuda", dtype="bfloat16", tensor_parallel=tp)
        try:
            runs.append(llm.generate(prompts, params))
        finally:
            llm.close()
    pairs = list(zip(runs[1], runs[0], strict=True))
    assert sum(a.token_ids[0] in {t for t, _ in b.top_logprobs[0]} for a, b in pairs) >= 15
    assert sum(a.token_ids == b.token_ids for a, b in pairs) >= 12
