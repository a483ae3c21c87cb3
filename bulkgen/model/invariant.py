"""Batch-invariant linears (--batch-invariant, issue 15): a row's projections and logits come out
the same bits whether it is alone, in a batch of 256, padded to a CUDA-graph bucket, prefilling or
decoding.

    make_batch_invariant(model)   after the weights are loaded: every nn.Linear becomes an
                                  InvariantLinear (the same Parameter objects, the same names),
                                  and the logits (VocabParallelEmbedding.logits) use
                                  invariant_linear too

invariant_linear dispatches by device:
- CUDA: the Triton GEMM of invariant_matmul.py, whose reduction order is fixed by (N, K, dtype).
- CPU: one F.linear per row, each on a fresh contiguous [1, K] copy of the row. MKL/oneDNN choose
  their kernel, blocking and threading from the shapes, strides, dtype, data alignment and thread
  count of a call; here every call has the same ones whatever M is (a fresh buffer from torch's
  CPU allocator is 64-byte aligned; a view of row i of x would be aligned by i * K * itemsize),
  so each row runs the same code on the same bytes. A large weight (lm_head) is split into
  slices of rows whose size depends on its shape alone. A correctness mode for the CPU: a row
  at a time is a matrix-vector product, slower than one GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bulkgen.model.fp8 import Fp8Linear, replace_modules
from bulkgen.model.parallel_layers import VocabParallelEmbedding

# The CPU path reads a weight above CPU_CACHE_BYTES in slices of about SLICE_BYTES (an L2's size).
CPU_CACHE_BYTES = 8 << 20
SLICE_BYTES = 1 << 20


def rowwise_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] -> [M, N] by one F.linear per row on a fresh contiguous copy (the CPU path).

    A weight larger than the cache is taken in slices of rows (their size set by K and the
    dtype alone), each used by every row before the next is read: the weight then streams from
    memory once per call instead of once per row.
    """
    M, K = x.shape
    N = weight.shape[0]
    out = x.new_empty((M, N))
    rows = [torch.empty((1, K), dtype=x.dtype, device=x.device).copy_(x[i]) for i in range(M)]
    step = N if weight.nbytes <= CPU_CACHE_BYTES else max(1, SLICE_BYTES // weight[0].nbytes)
    for start in range(0, N, step):
        w = weight[start : start + step]
        b = None if bias is None else bias[start : start + step]
        for i, row in enumerate(rows):
            out[i, start : start + step] = F.linear(row, w, b)[0]
    return out


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., K], each row's result independent of the others."""
    lead, K = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, K)
    if rows.is_cuda:
        from bulkgen.model.invariant_matmul import invariant_matmul  # Triton: a GPU-only import

        out = invariant_matmul(rows, weight, bias)
    else:
        out = rowwise_linear(rows, weight, bias)
    return out.view(*lead, weight.shape[0])


class InvariantLinear(nn.Module):
    """An nn.Linear's parameters (the same objects) with invariant_linear as its forward."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return invariant_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


def make_batch_invariant(model: nn.Module) -> nn.Module:
    """Make every GEMM of a loaded model batch-invariant, in place; returns the model.

    Call it after the weights are loaded (the loader fills nn.Linear parameters by name; the
    names and Parameter objects stay, so later state_dict reads are unchanged). Calling it twice
    changes nothing. FP8 projections have their own GEMM (cuBLASLt's) and are refused.
    """
    fp8 = [name for name, module in model.named_modules() if isinstance(module, Fp8Linear)]
    if fp8:
        raise ValueError(
            f"batch-invariant mode does not cover FP8 weights ({fp8[0]} is FP8): drop "
            "--quantization fp8 (or use the checkpoint's bf16 source) or drop --batch-invariant"
        )
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    replace_modules(model, names, InvariantLinear)
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):
            module.linear = invariant_linear
    return model
