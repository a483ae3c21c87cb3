"""A fused Triton sampler: the same tokens as `sampler.sample`, without a [B, V] temporary.

One program per row streams the row's logits in BLOCK-sized chunks; every pass is one read of the
row. The (seed, position, token id) noise of `sampler.uniform_noise` is hashed in registers.

- Pass A (every row): the max M and argmax of s = logits / T, and the exponential race over all
  tokens, argmax of s_i - log(-log u_i) (the order of p_i / -log u_i). A greedy row (T = 0) or a
  row without filters is done here: one pass.
- Filters keep the tokens with s above a threshold (top-k, top-p) and exp(s - M) >= min_p: every
  token above a kept one is kept. The race winner over all tokens, w, is also the winner over the
  kept ones if it is kept, so it is checked first: min-p alone needs no pass for that, top-k and
  top-p one cheap check pass (`_check_pass`: the count and mass above w and the total mass, one
  compare and one exp2 a token). Sampling a distribution whose top-p set holds 95% of the mass,
  w is kept in about 95% of the rows: 2 passes.
- A cut w cuts every token with x <= x_w, so the winner among the kept tokens is the race winner
  among x > x_w if that one is kept: rejection rounds of a race pass and a check pass until the
  winner is kept. Each round draws from the distribution above the last cut winner, so on
  model-like logits one round almost always suffices (simulated at T = 0.8, B = 256 with the
  logits of scripts/bench_sampler.py: Zipf, at most 1 round for top-p 0.95 and 2 for top-k 50;
  N(0, 4), up to ~7 for top-k 50). The ids are the torch reference's: the same race, over a
  superset of the kept tokens.
- top-k with top-p renormalises top-p over the top-k mass, so it first finds the top-k threshold
  by multi-pivot bisection without sorting (`_top_k_threshold`, `_pivot_pass`: the count and mass
  of tokens above each of NPIV pivots, one read); then the rounds go on as above.

Ties at a threshold keep every tied token: top-k keeps all tokens whose logit equals the k-th
largest, top-p counts only strictly larger tokens as "before" a token. (torch.sort orders ties
arbitrarily, so the reference may cut one of them.) With a bitmask, disallowed tokens get logit
-inf before anything, so the filters see the distribution restricted to the allowed tokens.
Everything is decided on the device: no host syncs, a fixed grid, safe to capture in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bulkgen.engine.triton_sampler_passes import (
    _check_pass,
    _first_pass,
    _narrow,
    _pivot_pass,
    _race_pass,
    _row_hash,
    _uniform,
)

BLOCK = 1024  # tokens per chunk in the one-dimensional passes
PIVOT_BLOCK = 512  # tokens per chunk in a pivot pass: its accumulators are [PIVOT_BLOCK, NPIV]
NPIV = 8  # pivots counted per search pass
MAX_PASSES = 40  # bound on search passes; float32 bisection ends in far fewer
NUM_WARPS = 8
# the kernel's tuning constants, passed as constexprs (scripts/compile_check.py reads them)
CONSTEXPRS = ("BLOCK", "PIVOT_BLOCK", "NPIV", "MAX_PASSES")


@triton.jit
def _sample_kernel(
    logits_ptr,
    stride_row,
    allowed_ptr,
    stride_allowed,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    seed_ptr,
    position_ptr,
    out_ptr,
    V,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    PIVOT_BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
    MAX_PASSES: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    row = tl.program_id(0)
    logits_ptr += row.to(tl.int64) * stride_row
    allowed_ptr += row.to(tl.int64) * stride_allowed
    temp = tl.load(temperature_ptr + row)
    greedy = temp <= 0.0
    c = 1.4426950408889634 / tl.where(greedy, 1.0, temp)  # log2(e) / T: s * log2(e) = x * c
    k = tl.load(top_k_ptr + row)
    p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    rh = _row_hash(tl.load(seed_ptr + row), tl.load(position_ptr + row))

    # Every logit below is a raw one (x, not s = x / T): see triton_sampler_passes.
    m, argmax, min_x, w, x_w = _first_pass(
        logits_ptr, allowed_ptr, V, c, rh, ~greedy, HAS_MASK, BLOCK, FAST_LOG
    )
    mc = m * c
    use_k = k > 0
    use_p = p < 1.0
    use_min_p = min_p > 0.0
    keep_w = (min_p <= 0.0) | (tl.exp2(x_w * c - mc) >= min_p)
    done = greedy | (~use_k & ~use_p & ~use_min_p) | (m == float("-inf"))
    if (~done) & (use_k | use_p):
        w_cnt, w_mass, w_minab, total = _check_pass(
            logits_ptr, allowed_ptr, V, c, mc, x_w, HAS_MASK, BLOCK
        )
        # Every token with x <= theta is cut; top-p counts the mass z of the top-k set.
        theta = tl.full((), float("-inf"), tl.float32)
        z = total
        if use_k & use_p:
            theta, z = _top_k_threshold(
                logits_ptr, allowed_ptr, V, c, mc, k, m, x_w, w_cnt, w_mass, w_minab, total,
                min_x, HAS_MASK, PIVOT_BLOCK, NPIV, MAX_PASSES,
            )  # fmt: skip
        kept = keep_w & (x_w > theta) & ((~use_k) | (w_cnt < k)) & ((~use_p) | (w_mass < p * z))
        # Rejection rounds: a cut w cuts every x <= x_w (the kept set is all x above a threshold),
        # and the race winner among x > x_w is the winner among the kept tokens if it is kept.
        # theta rises strictly each round and the largest logit is kept, so the loop ends.
        while ~kept:
            theta = tl.maximum(theta, x_w)
            w, x_w = _race_pass(
                logits_ptr, allowed_ptr, V, c, mc, rh, theta, min_p, HAS_MASK, BLOCK, FAST_LOG
            )
            w_cnt, w_mass, w_minab, total = _check_pass(
                logits_ptr, allowed_ptr, V, c, mc, x_w, HAS_MASK, BLOCK
            )
            no_token = x_w == float("-inf")  # min-p above 1 or top-p 0: nothing is kept
            kept = no_token | (((~use_k) | (w_cnt < k)) & ((~use_p) | (w_mass < p * z)))
        done = tl.full((), True, tl.int1)
    else:
        done |= keep_w
    ids = tl.where(greedy, argmax, w)
    if ~done:  # min-p alone cut w: the race among the tokens it keeps
        ids = _race_pass(
            logits_ptr, allowed_ptr, V, c, mc, rh, -float("inf"), min_p, HAS_MASK, BLOCK, FAST_LOG
        )[0]
    tl.store(out_ptr + row, ids.to(tl.int64))


@triton.jit
def _top_k_threshold(
    logits_ptr,
    allowed_ptr,
    V,
    c,
    mc,
    k,
    m,
    x_w,
    w_cnt,
    w_mass,
    w_minab,
    total,
    min_x,
    HAS_MASK: tl.constexpr,
    PIVOT_BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """(theta, mass above theta): top-k keeps exactly the tokens with x > theta.

    Multi-pivot bisection of the logit range (NPIV pivots a pass), from above x_w if the check
    pass found w cut by top-k. Only top-k followed by top-p needs the threshold itself (top-p
    renormalises over the top-k mass); alone, each filter just checks race winners.
    """
    # lo brackets theta from below (every x <= lo cut), hi from above (every x >= hi kept).
    w_cut = w_cnt >= k
    lo = tl.where(w_cut, x_w, float("-inf"))
    # Above -inf: at most V tokens (only "found" reads lo_cnt: a bound delays it, no more).
    lo_cnt = tl.where(w_cut, w_cnt, V)
    lo_mass = tl.where(w_cut, w_mass, total)
    lo_minab = tl.where(w_cut, w_minab, min_x)
    hi = m
    hi_cnt = tl.zeros((), tl.int32)
    hi_mass = tl.zeros((), tl.float32)
    j = tl.arange(0, NPIV)
    found = (lo_cnt == hi_cnt) | (hi <= lo_minab)
    passes = tl.full((), 0, tl.int32)
    while (~found) & (passes < MAX_PASSES):
        piv = lo_minab + (hi - lo_minab) * j.to(tl.float32) / NPIV
        cnt, mass, minab = _pivot_pass(
            logits_ptr, allowed_ptr, V, c, mc, piv, HAS_MASK, PIVOT_BLOCK, NPIV
        )
        lo, lo_cnt, lo_mass, lo_minab, hi, hi_cnt, hi_mass = _narrow(
            piv, cnt < k, cnt, mass, minab, lo, lo_cnt, lo_mass, lo_minab, hi, hi_cnt, hi_mass
        )
        # Found: no token in (lo, hi], or the smallest one above lo is >= hi (hence kept).
        found = (lo_cnt == hi_cnt) | (hi <= lo_minab)
        passes += 1
    return lo, lo_mass


@triton.jit
def _noise_kernel(seed_ptr, position_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    rh = _row_hash(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + row.to(tl.int64) * V + offs, _uniform(rh, offs), mask=offs < V)


def kernel_uniform_noise(
    seed: torch.Tensor, position: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """The kernel's u for every (row, token id): must equal `sampler.uniform_noise` bit for bit."""
    out = torch.empty(seed.shape[0], vocab_size, dtype=torch.float32, device=seed.device)
    _noise_kernel[(seed.shape[0],)](seed, position, out, vocab_size, BLOCK=BLOCK)
    return out


def fused_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token ids [B] int64 for float32 logits [B, V], as `sampler.sample` draws them.

    temperature 0 is greedy, top_k <= 0, top_p >= 1 and min_p <= 0 are off. `allowed` is an
    optional [B, ceil(V / 32)] int32 bitmask: bit j of word w allows token 32 * w + j.
    """
    b, v = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1, "float32 rows, unit stride"
    if allowed is not None:
        assert allowed.dtype == torch.int32 and allowed.shape == (b, -(-v // 32))
        assert allowed.stride(1) == 1
    mask = allowed if allowed is not None else logits  # never read without HAS_MASK
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    _sample_kernel[(b,)](
        logits,
        logits.stride(0),
        mask,
        mask.stride(0),
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
        position,
        out,
        v,
        HAS_MASK=allowed is not None,
        BLOCK=BLOCK,
        PIVOT_BLOCK=PIVOT_BLOCK,
        NPIV=NPIV,
        MAX_PASSES=MAX_PASSES,
        FAST_LOG=logits.is_cuda,  # the interpreter (CPU tensors) has no libdevice
        num_warps=NUM_WARPS,
    )
    return out
