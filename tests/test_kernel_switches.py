"""The experimental switches of switches.KERNEL_SWITCHES, read from the environment: what a run's
stats name, a bad value's error, and the 16-bit greedy argmax (CPU)."""

from __future__ import annotations

import pytest
import torch
from test_engine import PROMPTS, encode_all

from bulkgen import SamplingParams


def test_stats_name_the_experimental_switches_set_in_the_environment(tiny_model_dir, monkeypatch):
    import os

    from bulkgen import LLM

    for name in [k for k in os.environ if k.startswith("BULKGEN_")]:
        monkeypatch.delenv(name)
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate(encode_all(tiny_model_dir, PROMPTS[:1]), params)
    assert llm.engine.stats["env_overrides"] == {}
    monkeypatch.setenv("BULKGEN_SILU_FORM", "split")
    monkeypatch.setenv("BULKGEN_FP8_PDL", "1")  # never on the CPU, but the run says it was asked
    monkeypatch.setenv("BULKGEN_CPU_QUIET", "1")  # a run's own decision for its children: no switch
    monkeypatch.setenv("BULKGEN_PREFILL_F16", "1")
    monkeypatch.setenv("BULKGEN_FP8_HW_ROUNDING", "0")
    monkeypatch.setenv("BULKGEN_BLAS", "cublaslt")  # CUDA only, named all the same
    expected = {"BULKGEN_FP8_PDL": "1", "BULKGEN_SILU_FORM": "split"}
    expected |= {"BULKGEN_PREFILL_F16": "1", "BULKGEN_FP8_HW_ROUNDING": "0"}
    expected |= {"BULKGEN_BLAS": "cublaslt"}
    assert llm.engine.stats["env_overrides"] == expected


def test_a_blas_library_that_is_not_one_fails_at_load(tiny_model_dir, monkeypatch):
    from bulkgen import LLM
    from bulkgen.model.switches import blas_library

    monkeypatch.setenv("BULKGEN_BLAS", "mkl")
    with pytest.raises(ValueError, match="BULKGEN_BLAS must be one of cublas, cublaslt"):
        LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    monkeypatch.setenv("BULKGEN_BLAS", "cublaslt")
    assert blas_library(torch.device("cpu")) == "cublaslt"  # named; the CPU has no cuBLAS to set
    monkeypatch.delenv("BULKGEN_BLAS")
    assert blas_library(torch.device("cpu")) is None
    chosen = []  # on CUDA: cuBLASLt unless BULKGEN_BLAS names cuBLAS (no GPU needed to see it)
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", chosen.append)
    monkeypatch.setattr(torch.version, "hip", None)
    assert blas_library(torch.device("cuda")) == "cublaslt"
    monkeypatch.setenv("BULKGEN_BLAS", "cublas")
    assert blas_library(torch.device("cuda")) == "cublas" and chosen == ["cublaslt", "cublas"]


@pytest.mark.parametrize(
    "name", ["BULKGEN_BF16_ARGMAX", "BULKGEN_FP8_HW_ROUNDING", "BULKGEN_ATTN_FP8_PV"]
)
def test_an_on_off_switch_that_is_not_1_or_0_fails_at_load(tiny_model_dir, monkeypatch, name):
    from bulkgen import LLM

    monkeypatch.setenv(name, "yes")  # read each step or launch later: checked before any
    with pytest.raises(ValueError, match=f"{name} must be 1 or 0, got 'yes'"):
        LLM(str(tiny_model_dir), dtype="float32", device="cpu")


def test_plain_greedy_steps_can_take_the_argmax_of_16_bit_logits(tiny_model_dir, monkeypatch):
    # sampler.float_logits (BF16_ARGMAX, on by default): a step whose sampled rows are all plain
    # greedy skips the float32 copy of its logits; the argmax of the 16-bit values is the argmax
    # of their exact widening, so the tokens are the same.
    from bulkgen import LLM
    from bulkgen.engine.sampler import float_logits
    from bulkgen.model.llama import LlamaForCausalLM

    monkeypatch.delenv("BULKGEN_BF16_ARGMAX", raising=False)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    logprobs = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)
    penalized = SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.3)
    sampled = SamplingParams(max_tokens=12, temperature=0.8, seed=3)
    assert not float_logits([greedy])  # the default
    monkeypatch.setenv("BULKGEN_BF16_ARGMAX", "0")
    assert float_logits([greedy])
    monkeypatch.setenv("BULKGEN_BF16_ARGMAX", "1")
    assert not float_logits([greedy, greedy]) and not float_logits([])
    for other in (logprobs, penalized, sampled, SamplingParams(temperature=0.0, choice=["a"])):
        assert float_logits([greedy, other]), other
    assert float_logits([greedy], batch_invariant=True)

    widths = []
    compute_logits = LlamaForCausalLM.compute_logits

    def spy(self, hidden, widen=True):
        out = compute_logits(self, hidden, widen)
        widths.append(out.dtype)
        return out

    monkeypatch.setattr(LlamaForCausalLM, "compute_logits", spy)
    llm = LLM(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    ids = encode_all(tiny_model_dir, PROMPTS)
    narrow = [o.token_ids for o in llm.generate(ids, greedy)]
    assert torch.bfloat16 in widths and torch.float32 not in widths[-3:]
    monkeypatch.setenv("BULKGEN_BF16_ARGMAX", "0")
    widths.clear()
    assert [o.token_ids for o in llm.generate(ids, greedy)] == narrow
    assert set(widths) == {torch.float32}
