"""Warm-up passes: compile kernels and measure activation memory before the KV cache is sized.

The first real prefill would otherwise compile Triton kernels and pick cuBLAS algorithms inside
the timed run (seconds of an idle GPU). Two plans cover the step shapes that matter: the largest
prefill (one sequence of max_batch_tokens) and the widest sampling step (EngineConfig.seq_rows
sequences sampling with every filter on), which also holds the sampler's largest [seqs, vocab]
temporaries. The widest decode step (graph_rows sequences of one token) builds the decode kernels
the largest graph replays and tells how much memory that graph's pool will keep. Then
warm_logits runs the lm_head at every row count a step can sample: cuBLAS's first GEMM at a new
count waits for the GPU, which the plans' few counts would leave to the run.
"""

from __future__ import annotations

import torch

from bulkgen.config import EngineConfig, SamplingParams
from bulkgen.engine.plan import Plan, ScheduledSeq
from bulkgen.engine.request import Request

# Every filter and the widest logprobs (OpenAI's maximum of 20): the sampler's and the logprob
# path's largest temporaries and pinned buffers exist before the KV cache is sized.
_FILTERED = SamplingParams(
    max_tokens=1, temperature=1.0, top_k=50, top_p=0.9, min_p=0.01, logprobs=20
)


WARM_LOGITS_ROWS = 1024  # warm_logits' most rows: --max-num-seqs auto's ceiling


def warmup_plans(
    cfg: EngineConfig, max_model_len: int, num_blocks: int | None = None
) -> list[Plan]:
    """num_blocks: the cache's size, when it may be smaller than the plans' blocks (their block
    ids then wrap around: warm-up results are garbage either way)."""
    tokens = min(cfg.max_batch_tokens, max_model_len - 1)
    seqs = min(cfg.seq_rows, tokens)
    long_prefill = [tokens]
    wide = [tokens // seqs + (i < tokens % seqs) for i in range(seqs)]
    # Triton specialises kernels on integer arguments equal to 1 or divisible by 16; a step of
    # other sizes would compile new variants in the middle of the run (seconds of idle GPU, seen
    # on the H200). Odd totals and lengths, and a lone token, cover those variants.
    odd = [n for n in (1, 17, 333) if n <= tokens] or [1]
    # A mixed step whose longest query is short picks the prefill kernel's small-tile variant.
    short = [2, 1] if tokens >= 3 and seqs >= 2 else [1]
    # A mixed step of many decoding rows and a chunk: the Triton backend splits its attention
    # (triton_backend.SPLIT_MIXED_MIN_ROWS, 160), an odd count of rows before the chunk.
    split = [1] * min(seqs - 1, tokens - 17, 333) + [17] if seqs > 1 and tokens > 18 else [1]
    plans = [long_prefill, wide, odd, short, split, [1] * min(3, seqs), [1]]
    plans = [_plan(lengths, cfg.block_size, num_blocks) for lengths in plans]
    return plans + [widest_decode(cfg, num_blocks)]


def warm_logits(model: torch.nn.Module, rows: int, stream: torch.cuda.Stream) -> None:
    """The lm_head's GEMM once at every row count a step can sample (1..rows), on `stream`.
    On the H200 (torch 2.11, CUDA 13) cuBLAS's first GEMM at a new row count waits for the GPU
    to finish everything queued before it (202 ms behind a 200 ms sleep, 0.2 ms the second time;
    scripts/bench_gemm_first_use.py: not module loading), and the rows that sample change from
    step to step: without this, bulk FP8 runs at 8,192-token steps spent each step with
    prefill's launch (125 ms median) in the logits' F.linear, and the GPU idled after it.
    The counts go up to WARM_LOGITS_ROWS: the warm-up's time grows with the square of the rows
    (about 1 s for 1,024 on the 8B shape's vocabulary, by arithmetic), and a count past it waits
    once in a run, as every count did before."""
    rows = min(rows, WARM_LOGITS_ROWS)
    table = model.model.embed_tokens.weight  # [vocab rows, hidden] in the activations' dtype
    with torch.cuda.stream(stream):
        hidden = table.new_zeros(rows, table.shape[1])
        for m in range(1, rows + 1):
            model.compute_logits(hidden[:m], widen=False)
    stream.synchronize()


def widest_decode(cfg: EngineConfig, num_blocks: int | None = None, sample: bool = True) -> Plan:
    """A decode step of the most rows a decode graph is captured for (`sample` False: no row
    samples, so its forward stops at the hidden state, as the graph does)."""
    return _plan([1] * cfg.graph_rows, cfg.block_size, num_blocks, sample)


def fullest_step(
    cfg: EngineConfig, max_model_len: int, num_blocks: int | None = None, sample: bool = True
) -> Plan:
    """A step of max_batch_tokens tokens, the largest a mixed graph is captured for: at most
    seq_rows prompts (the tables' rows) of at most max_model_len - 1 tokens each, so fewer tokens
    when those cannot hold them (as no step can); block ids wrap around num_blocks."""
    longest = max(1, max_model_len - 1)
    tokens = min(cfg.max_batch_tokens, cfg.seq_rows * longest)
    full, rest = divmod(tokens, longest)
    return _plan([longest] * full + [rest] * (rest > 0), cfg.block_size, num_blocks, sample)


def warmup_blocks(cfg: EngineConfig, max_model_len: int) -> int:
    """Cache blocks the warm-up plans need (each sequence's blocks are its own)."""
    return max(
        sum(len(s.request.block_ids) for s in p.seqs) for p in warmup_plans(cfg, max_model_len)
    )


def _plan(
    lengths: list[int], block_size: int, num_blocks: int | None = None, sample: bool = True
) -> Plan:
    plan, next_block = Plan(), 0
    for i, n in enumerate(lengths):
        req = Request(f"warmup-{i}", [1] * n, _FILTERED, seed=i, table_row=i)
        count = -(-n // block_size)
        req.block_ids = list(range(next_block, next_block + count))
        if num_blocks is not None:
            req.block_ids = [b % num_blocks for b in req.block_ids]
        next_block += count
        plan.seqs.append(ScheduledSeq(req, start=0, num_tokens=n, sample=sample, from_prev=False))
    return plan
