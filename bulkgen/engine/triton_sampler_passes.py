"""The passes of the fused sampler (`triton_sampler`): each reads one row's logits once.

Per-token state lives in per-lane accumulators ([BLOCK] or [PIVOT_BLOCK, NPIV] registers) that
are reduced once at the end of a pass, not once per chunk.

The passes work on the raw logits x, never on s = x / T: with c = log2(e) / T, s - s' = ln 2 *
(x - x') * c, so order tests compare x (T > 0 keeps the order), the mass exp(s - M) is
exp2(x * c - M * c) (one FMA and one ex2.approx) and the race key s - log(-log u) is, up to a
factor ln 2 and a constant, x * c - log2(-log2 u) (two lg2.approx). tl.log would lower to
libdevice's logf (a branchy ~20-instruction routine) and x / T to a division per token.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

MASK32 = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _fmix64(h):
    """sampler._fmix on int64 values: the carry of a 64-bit add reaches the first shift."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


@triton.jit
def _row_hash(seed, position):
    """The per-row part of sampler.uniform_noise, in int64 as torch computes it; a uint32."""
    lo = seed & MASK32
    hi = (seed >> 32) & MASK32
    row = _fmix64(_fmix64(lo ^ _fmix64(hi + 0x9E3779B9)) ^ (position & MASK32))
    return row.to(tl.uint32)


@triton.jit
def _uniform(row_hash, offs):
    """u in (0, 1) for token ids offs, bit for bit sampler.uniform_noise, in uint32 arithmetic."""
    h = row_hash ^ (offs.to(tl.uint32) * 0x27D4EB2F)
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    h = h ^ (h >> 16)
    # torch adds 0x165667B1 in int64 before the next finaliser: its carry is bit 32, which the
    # first shift (h >> 16) moves to bit 16.
    x = h + 0x165667B1
    carry = (x < h).to(tl.uint32)
    h = x ^ ((x >> 16) | (carry << 16))
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    h = h ^ (h >> 16)
    return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # < 1: see uniform_noise


@triton.jit
def _scaled(logits_ptr, allowed_ptr, offs, V, HAS_MASK: tl.constexpr):
    """The raw logits of one chunk; -inf past the vocabulary and at disallowed tokens."""
    inside = offs < V
    s = tl.load(logits_ptr + offs, mask=inside, other=float("-inf"))
    if HAS_MASK:
        word = tl.load(allowed_ptr + offs // 32, mask=inside, other=0)
        s = tl.where(((word >> (offs % 32)) & 1) != 0, s, float("-inf"))
    return s


@triton.jit
def _argmax(val, idx, V):
    """(max, smallest index holding it) of per-lane (value, index) accumulators."""
    best = tl.max(val, axis=0)
    return best, tl.min(tl.where(val == best, idx, V), axis=0)


@triton.jit
def _log2(x, FAST_LOG: tl.constexpr):
    """log2: lg2.approx on the GPU (tl.log2 would call libdevice's accurate log2f); the
    interpreter has no libdevice, so it takes tl.log2."""
    if FAST_LOG:
        return libdevice.fast_log2f(x)
    return tl.log2(x)


@triton.jit
def _race_key(x, c, row_hash, offs, FAST_LOG: tl.constexpr):
    """The race key of tokens offs with logits x: argmax of p_i / -log(u_i), in log2 units."""
    return x * c - _log2(-_log2(_uniform(row_hash, offs), FAST_LOG), FAST_LOG)


@triton.jit
def _first_pass(
    logits_ptr,
    allowed_ptr,
    V,
    c,
    row_hash,
    race,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    """max, argmax, smallest finite x; and the race winner over all tokens (and its x) if race."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK], tl.int32)
    low = tl.full([BLOCK], float("inf"), tl.float32)
    r_best = tl.full([BLOCK], float("-inf"), tl.float32)
    r_i = tl.zeros([BLOCK], tl.int32)
    r_s = tl.full([BLOCK], float("-inf"), tl.float32)
    if race:
        for start in range(0, V, BLOCK):
            s = _scaled(logits_ptr, allowed_ptr, start + offs, V, HAS_MASK)
            up = s > best
            best_i = tl.where(up, start + offs, best_i)
            best = tl.where(up, s, best)
            low = tl.minimum(low, tl.where(s > float("-inf"), s, float("inf")))
            r = _race_key(s, c, row_hash, start + offs, FAST_LOG)
            up = r > r_best
            r_i = tl.where(up, start + offs, r_i)
            r_s = tl.where(up, s, r_s)
            r_best = tl.where(up, r, r_best)
    else:
        for start in range(0, V, BLOCK):
            s = _scaled(logits_ptr, allowed_ptr, start + offs, V, HAS_MASK)
            up = s > best
            best_i = tl.where(up, start + offs, best_i)
            best = tl.where(up, s, best)
    m, argmax = _argmax(best, best_i, V)
    r_max, w = _argmax(r_best, r_i, V)
    w_s = tl.max(tl.where(r_i == w, r_s, float("-inf")), axis=0)
    return m, argmax, tl.min(low, axis=0), tl.where(r_max > float("-inf"), w, argmax), w_s


@triton.jit
def _pivot_pass(
    logits_ptr,
    allowed_ptr,
    V,
    c,
    mc,
    piv,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
):
    """For each pivot: the count and mass (sum of exp(s - M), mc = M * c) of tokens with
    x > pivot, and the smallest such x."""
    offs = tl.arange(0, BLOCK)
    cnt = tl.zeros([BLOCK, NPIV], tl.int32)
    mass = tl.zeros([BLOCK, NPIV], tl.float32)
    low = tl.full([BLOCK, NPIV], float("inf"), tl.float32)
    for start in range(0, V, BLOCK):
        s = _scaled(logits_ptr, allowed_ptr, start + offs, V, HAS_MASK)
        e = tl.exp2(s * c - mc)
        above = s[:, None] > piv[None, :]
        cnt += above.to(tl.int32)
        mass += tl.where(above, e[:, None], 0.0)
        low = tl.minimum(low, tl.where(above, s[:, None], float("inf")))
    return tl.sum(cnt, axis=0), tl.sum(mass, axis=0), tl.min(low, axis=0)


@triton.jit
def _check_pass(
    logits_ptr, allowed_ptr, V, c, mc, x_w, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr
):
    """The one-pivot pass that checks the race winner w (logit x_w): the count and mass of the
    tokens with x > x_w, the smallest such x, and the row's total mass Z = sum exp(s - M).

    Per token: one FMA and one ex2 (the mass), one compare, and three selects feeding an add, an
    add and a min: a fifth of what the NPIV-pivot pass costs.
    """
    offs = tl.arange(0, BLOCK)
    cnt = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    low = tl.full([BLOCK], float("inf"), tl.float32)
    for start in range(0, V, BLOCK):
        s = _scaled(logits_ptr, allowed_ptr, start + offs, V, HAS_MASK)
        e = tl.exp2(s * c - mc)
        above = s > x_w
        total += e
        cnt += above.to(tl.int32)
        mass += tl.where(above, e, 0.0)
        low = tl.minimum(low, tl.where(above, s, float("inf")))
    return tl.sum(cnt, axis=0), tl.sum(mass, axis=0), tl.min(low, axis=0), tl.sum(total, axis=0)


@triton.jit
def _narrow(piv, ok, cnt, mass, minab, lo, lo_cnt, lo_mass, lo_minab, hi, hi_cnt, hi_mass):
    """Move lo up to the largest pivot not kept, hi down to the smallest kept, with their stats.

    Invariant: every token with s <= lo is cut, every token with s > hi is kept, and a token
    equal to hi is kept. ok is monotone in the pivot, so the two never cross.
    """
    new_lo = tl.max(tl.where(ok, float("-inf"), piv), axis=0)
    at_lo = (~ok) & (piv == new_lo)
    up = new_lo > lo
    lo_cnt = tl.where(up, tl.max(tl.where(at_lo, cnt, -1), axis=0), lo_cnt)
    lo_mass = tl.where(up, tl.max(tl.where(at_lo, mass, -1.0), axis=0), lo_mass)
    lo_minab = tl.where(up, tl.min(tl.where(at_lo, minab, float("inf")), axis=0), lo_minab)
    lo = tl.where(up, new_lo, lo)
    new_hi = tl.min(tl.where(ok, piv, float("inf")), axis=0)
    at_hi = ok & (piv == new_hi)
    down = new_hi < hi
    hi_cnt = tl.where(down, tl.max(tl.where(at_hi, cnt, -1), axis=0), hi_cnt)
    hi_mass = tl.where(down, tl.max(tl.where(at_hi, mass, -1.0), axis=0), hi_mass)
    hi = tl.where(down, new_hi, hi)
    return lo, lo_cnt, lo_mass, lo_minab, hi, hi_cnt, hi_mass


@triton.jit
def _race_pass(
    logits_ptr,
    allowed_ptr,
    V,
    c,
    mc,
    row_hash,
    theta,
    min_p,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    """The race winner among tokens with x > theta and exp(s - M) >= min_p, and its logit x
    (-inf if no token is kept)."""
    offs = tl.arange(0, BLOCK)
    r_best = tl.full([BLOCK], float("-inf"), tl.float32)
    r_i = tl.zeros([BLOCK], tl.int32)
    r_s = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        s = _scaled(logits_ptr, allowed_ptr, start + offs, V, HAS_MASK)
        kept = (s > theta) & (tl.exp2(s * c - mc) >= min_p)
        r = tl.where(kept, _race_key(s, c, row_hash, start + offs, FAST_LOG), float("-inf"))
        up = r > r_best
        r_i = tl.where(up, start + offs, r_i)
        r_s = tl.where(up, s, r_s)
        r_best = tl.where(up, r, r_best)
    w = _argmax(r_best, r_i, V)[1]
    return w, tl.max(tl.where(r_i == w, r_s, float("-inf")), axis=0)
