"""Structured output on CUDA: masks uploaded with the step and applied by the fused sampler."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from bulkgen import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_constrained_rows_validate_and_both_loops_agree(tiny_model_dir):
    from test_structured_output import PROMPTS, SCHEMAS

    schema = SCHEMAS["array_enum_range"]
    params = [
        SamplingParams(max_tokens=48, temperature=t, seed=i, json_schema=json.dumps(schema))
        for i, t in enumerate([0.0, 1.0, 1.0, 0.7])
    ]
    kw = dict(dtype="float32", device="cuda", max_num_seqs=8)
    fast = LLM(str(tiny_model_dir), **kw).generate(PROMPTS, params)
    sync = LLM(str(tiny_model_dir), async_loop=False, **kw).generate(PROMPTS, params)
    assert [o.token_ids for o in fast] == [o.token_ids for o in sync]
    stopped = [o for o in fast if o.finish_reason == "stop"]
    assert stopped
    for out in stopped:
        jsonschema.validate(json.loads(out.text), schema)


def test_cuda_greedy_constrained_matches_cpu(tiny_model_dir):
    from test_structured_output import PROMPTS, REGEX

    params = SamplingParams(max_tokens=24, temperature=0.0, regex=REGEX)
    kw = dict(dtype="float32", max_num_seqs=8)
    gpu = LLM(str(tiny_model_dir), device="cuda", **kw).generate(PROMPTS, params)
    cpu = LLM(str(tiny_model_dir), device="cpu", **kw).generate(PROMPTS, params)
    assert [o.token_ids for o in gpu] == [o.token_ids for o in cpu]
