"""The passes of the fused sampler (`triton_sampler`): each reads one row's logits once.

Per-token state lives in per-lane accumulators ([BLOCK] or [PIVOT_BLOCK, NPIV] registers) that
are reduced once at the end of a pass, not once per chunk.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
    return ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _scaled(logits_ptr, allowed_ptr, offs, V, t, HAS_MASK: tl.constexpr):
    """logits / T for one chunk; -inf past the vocabulary and at disallowed tokens."""
    inside = offs < V
    s = tl.load(logits_ptr + offs, mask=inside, other=float("-inf")) / t
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
def _first_pass(
    logits_ptr, allowed_ptr, V, t, row_hash, race, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr
):
    """max, argmax, smallest finite s; and the race winner over all tokens (and its s) if race."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK], tl.int32)
    low = tl.full([BLOCK], float("inf"), tl.float32)
    r_best = tl.full([BLOCK], float("-inf"), tl.float32)
    r_i = tl.zeros([BLOCK], tl.int32)
    r_s = tl.full([BLOCK], float("-inf"), tl.float32)
    if race:
        for start in range(0, V, BLOCK):
            s = _scaled(logits_ptr, allowed_ptr, start + offs, V, t, HAS_MASK)
            up = s > best
            best_i = tl.where(up, start + offs, best_i)
            best = tl.where(up, s, best)
            low = tl.minimum(low, tl.where(s > float("-inf"), s, float("inf")))
            # argmax of p_i / -log(u_i) is argmax of s_i - log(-log(u_i))
            r = s - tl.log(-tl.log(_uniform(row_hash, start + offs)))
            up = r > r_best
            r_i = tl.where(up, start + offs, r_i)
            r_s = tl.where(up, s, r_s)
            r_best = tl.where(up, r, r_best)
    else:
        for start in range(0, V, BLOCK):
            s = _scaled(logits_ptr, allowed_ptr, start + offs, V, t, HAS_MASK)
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
    t,
    m,
    piv,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    NPIV: tl.constexpr,
):
    """For each pivot: the count and mass (sum of exp(s - m)) of tokens with s > pivot, and the
    smallest such s."""
    offs = tl.arange(0, BLOCK)
    cnt = tl.zeros([BLOCK, NPIV], tl.int32)
    mass = tl.zeros([BLOCK, NPIV], tl.float32)
    low = tl.full([BLOCK, NPIV], float("inf"), tl.float32)
    for start in range(0, V, BLOCK):
        s = _scaled(logits_ptr, allowed_ptr, start + offs, V, t, HAS_MASK)
        e = tl.exp(s - m)
        above = s[:, None] > piv[None, :]
        cnt += above.to(tl.int32)
        mass += tl.where(above, e[:, None], 0.0)
        low = tl.minimum(low, tl.where(above, s[:, None], float("inf")))
    return tl.sum(cnt, axis=0), tl.sum(mass, axis=0), tl.min(low, axis=0)


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
    t,
    m,
    row_hash,
    theta,
    min_p,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The race winner among tokens with s > theta and exp(s - m) >= min_p."""
    offs = tl.arange(0, BLOCK)
    r_best = tl.full([BLOCK], float("-inf"), tl.float32)
    r_i = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        s = _scaled(logits_ptr, allowed_ptr, start + offs, V, t, HAS_MASK)
        kept = (s > theta) & (tl.exp(s - m) >= min_p)
        r = s - tl.log(-tl.log(_uniform(row_hash, start + offs)))
        r = tl.where(kept, r, float("-inf"))
        up = r > r_best
        r_i = tl.where(up, start + offs, r_i)
        r_best = tl.where(up, r, r_best)
    return _argmax(r_best, r_i, V)[1]
