"""Sampling and logprobs compute each row independently of its batch (`--batch-invariant`).

The samplers draw a row's token from its own logits, parameters and (seed, position) noise: one
Triton program per row with fixed blocks, or torch ops reducing each row on its own. Logprobs
need the row's log-sum-exp, which torch's CUDA reduction sums in an order that follows the batch
size; with batch_invariant it comes from row_logsumexp (one Triton program per row on CUDA, one
[V] reduction per row elsewhere). Without CUDA the Triton kernels run under the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from bulkgen.engine.sampler import SamplingTensors, row_logsumexp, sample, top_logprobs  # noqa: E402
from bulkgen.engine.triton_logprobs import logsumexp_rows  # noqa: E402
from bulkgen.engine.triton_sampler import fused_sample  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU = torch.device("cpu")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rows_alone(f, logits: torch.Tensor) -> torch.Tensor:
    return torch.cat([f(logits[i : i + 1]) for i in range(logits.shape[0])])


def settings(b: int, device: torch.device) -> dict:
    """Greedy, plain, top-k, top-p, min-p and combined rows, each with its own seed."""
    table = [(0.0, 0, 1.0, 0.0), (0.8, 0, 1.0, 0.0), (1.0, 50, 1.0, 0.0), (0.7, 0, 0.9, 0.0)]
    table += [(1.2, 0, 1.0, 0.05), (0.9, 40, 0.8, 0.01)]
    rows = [table[i % len(table)] for i in range(b)]
    col = lambda j, dtype: torch.tensor([r[j] for r in rows], dtype=dtype, device=device)  # noqa: E731
    return dict(
        temperature=col(0, torch.float32),
        top_k=col(1, torch.int64),
        top_p=col(2, torch.float32),
        min_p=col(3, torch.float32),
        seed=torch.arange(b, device=device) * 7919 + 3,
        position=torch.arange(b, device=device) * 13 + 5,
    )


def test_row_logsumexp_is_the_same_for_a_row_alone_and_in_any_batch():
    logits = torch.randn(9, 128256) * 3  # a Llama-3 vocabulary: reductions long enough to split
    batch = row_logsumexp(logits)
    assert torch.equal(rows_alone(row_logsumexp, logits), batch)
    assert torch.equal(row_logsumexp(logits[2:4]), batch[2:4])
    assert torch.allclose(batch, logits.logsumexp(-1), rtol=1e-6)


def test_row_logsumexp_on_the_cpu_is_the_same_whatever_the_thread_count():
    """bulkgen picks its CPU threads from the machine's load; torch's own logsumexp splits a
    49,152-long row between threads (its last bit differed in 102 of 2,000 rows, 1 against 2)."""
    logits = torch.randn(300, 49152) * 3
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = row_logsumexp(logits)
        torch.set_num_threads(2)
        two = row_logsumexp(logits)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert torch.allclose(one, logits.double().logsumexp(-1).float(), rtol=0, atol=2e-6)


def test_top_logprobs_batch_invariant_gives_a_row_the_same_logprobs_alone_and_in_a_batch():
    logits = torch.randn(7, 50000) * 3
    ids = torch.randint(0, 50000, (7,))
    batch = top_logprobs(logits, ids, 5, batch_invariant=True)
    for i in range(7):
        alone = top_logprobs(logits[i : i + 1], ids[i : i + 1], 5, batch_invariant=True)
        assert all(torch.equal(a[0], b[i]) for a, b in zip(alone, batch, strict=True))
    default = top_logprobs(logits, ids, 5)
    assert torch.equal(batch[1], default[1])  # the same top ids
    assert torch.allclose(batch[0], default[0], atol=1e-5)
    assert torch.allclose(batch[2], default[2], atol=1e-5)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter's log(0)
def test_triton_logsumexp_matches_torch_over_row_tails_and_minus_inf():
    v = 2007  # not a multiple of the kernel's block: the tail of a row is masked
    logits = torch.randn(4, v, device=DEVICE) * 3
    logits[1, ::3] = float("-inf")  # masked tokens count for nothing
    logits[3] = float("-inf")  # a row with no finite logit: -inf, not NaN
    out = logsumexp_rows(logits)
    assert torch.allclose(out[:3], logits[:3].logsumexp(-1), rtol=1e-6)
    assert out[3].item() == float("-inf")
    assert torch.equal(rows_alone(logsumexp_rows, logits), out)


COMPILE_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bulkgen.engine import triton_logprobs as t
signature = {"logits_ptr": "*fp32", "stride_row": "i32", "out_ptr": "*fp32", "V": "i32",
             "BLOCK": "constexpr"}
src = ASTSource(t._logsumexp_kernel, signature, constexprs={"BLOCK": t.BLOCK})
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": t.NUM_WARPS})
print(len(kernel.asm["ptx"]))
"""


def test_triton_logsumexp_compiles_for_sm90():
    """The interpreter never runs the GPU compiler: compile the kernel for Hopper without a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])  # this checkout
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_SM90], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0


def test_fused_sampler_draws_a_row_the_same_token_alone_and_in_a_batch():
    b, v = 12, 1500
    logits = torch.randn(b, v, device=DEVICE) * 2
    p = settings(b, DEVICE)
    batch = fused_sample(logits, **p)
    for i in range(b):
        alone = fused_sample(logits[i : i + 1], **{k: t[i : i + 1] for k, t in p.items()})
        assert alone.item() == batch[i].item()


def test_torch_sampler_draws_a_row_the_same_token_alone_and_in_a_batch():
    b, v = 12, 32000
    logits = torch.randn(b, v) * 2
    p = settings(b, CPU)

    def draw(rows: slice) -> torch.Tensor:
        st = SamplingTensors(
            **{k: t[rows] for k, t in p.items()}, all_greedy=False, any_filter=True
        )
        return sample(logits[rows], st)

    batch = draw(slice(0, b))
    assert torch.equal(torch.cat([draw(slice(i, i + 1)) for i in range(b)]), batch)


@gpu
@needs_cuda
def test_gpu_logprobs_of_a_row_are_the_same_alone_and_in_a_batch_of_256():
    logits = torch.randn(256, 128256, device=DEVICE) * 3
    ids = torch.randint(0, 128256, (256,), device=DEVICE)
    batch = top_logprobs(logits, ids, 20, batch_invariant=True)
    for i in (0, 77, 255):
        alone = top_logprobs(logits[i : i + 1], ids[i : i + 1], 20, batch_invariant=True)
        assert all(torch.equal(a[0], b[i]) for a, b in zip(alone, batch, strict=True))
    assert torch.allclose(batch[0], logits.gather(1, ids[:, None])[:, 0] - logits.logsumexp(-1))
