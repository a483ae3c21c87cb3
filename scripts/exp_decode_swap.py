"""Experiment: an fp8-cache decode kernel with the products swapped (tokens as the MMA's M).

    PYTHONPATH=. python scripts/exp_decode_swap.py --compile   # sm_90 PTX, no GPU
    PYTHONPATH=. python scripts/exp_decode_swap.py             # H200: accuracy and time

The engine's split kernel (triton_decode.py) puts the GROUP query heads of a kv head on the MMA's
M (padded to 16 rows): sm_90 runs that on mma.sync with fp16 operands, every fp8 K and V element
converted first. Here S^T = K q^T and O^T = V^T P^T put BLOCK_N tokens (K, from its rows) and
head_dim (V^T: the slots-inner value layout) on M = 128, the size Hopper's warpgroup MMA (wgmma)
takes. FP8_MMA: q (a scale per head) and P (x256) as e4m3 too, so both products read the cache's
bytes as they are; else fp16 operands (the cache converted, as the engine's kernel does).
One split per (sequence, kv head); no reduction. Times against the engine's kernel at the tune
shapes; the error is against a float32 reference over the same fp8 cache.
"""

from __future__ import annotations

import argparse
import json
import re
from functools import partial

import torch
import triton
import triton.language as tl

_P_SCALE = tl.constexpr(256.0)
_E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def _decode_swap_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, seq_lens_ptr, block_tables_ptr, out_ptr,
    qk_scale, v_scale,
    stride_qt, stride_qh, stride_bt,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_head, stride_v_dim,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, FP8_MMA: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    num_q_heads = tl.num_programs(1) * GROUP
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + b * stride_qt + heads[:, None] * stride_qh + dims[None, :],
        mask=head_mask[:, None], other=0.0,
    ).to(tl.float32) * qk_scale  # fmt: skip
    if FP8_MMA:
        q_amax = tl.max(tl.abs(q), axis=1)
        q_scale = tl.where(q_amax > 0, q_amax / _E4M3_MAX, 1.0)
        q_t = tl.trans((q / q_scale[:, None]).to(tl.float8e4nv))  # [D, G]
    else:
        q_scale = tl.full([GROUP_PAD], 1.0, tl.float32)
        q_t = tl.trans(q.to(tl.float16))
    seq_len = tl.load(seq_lens_ptr + b)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([HEAD_DIM, GROUP_PAD], tl.float32)  # O^T
    row = block_tables_ptr + b.to(tl.int64) * stride_bt
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < seq_len
        in_table = pos // BLOCK_SIZE < tl.cdiv(seq_len, BLOCK_SIZE)
        blocks = tl.load(row + pos // BLOCK_SIZE, mask=in_table, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        k_off = blocks * stride_k_block + slot * stride_k_slot + kv_head * stride_k_head
        k = tl.load(k_cache_ptr + k_off[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        v_off = (
            blocks * stride_v_block + slot + kv_head * stride_v_head
        )  # slots inner: slot stride 1
        v_off = tl.max_contiguous(tl.multiple_of(v_off, BLOCK_SIZE), BLOCK_SIZE)
        v_t = tl.load(v_cache_ptr + v_off[None, :] + dims[:, None] * stride_v_dim,
                      mask=in_table[None, :], other=0.0)  # [D, N]  # fmt: skip
        if not FP8_MMA:
            k = k.to(tl.float16)
            v_t = v_t.to(tl.float16)
        s_t = tl.dot(k, q_t) * q_scale[None, :]  # [N, G]
        s_t = tl.where(valid[:, None], s_t, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_t, axis=0))
        p_t = tl.exp2(s_t - m_new[None, :])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p_t, axis=0)
        if FP8_MMA:
            pv = tl.dot(v_t, (p_t * _P_SCALE).to(tl.float8e4nv))
        else:
            pv = tl.dot(v_t, p_t.to(tl.float16))
        acc = acc * alpha[None, :] + pv
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    norm = v_scale / (l_safe * _P_SCALE) if FP8_MMA else v_scale / l_safe
    out = acc * norm[None, :]
    out_ptrs = out_ptr + b * num_q_heads * HEAD_DIM + heads[None, :] * HEAD_DIM + dims[:, None]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=head_mask[None, :])


def decode_swap(q, k_cache, v_si, seq_lens, block_tables, scale, fp8_mma, block_n=128, warps=4,
                stages=None, k_scale=1.0, v_scale=1.0):  # fmt: skip
    """q [B, Hq, D] bf16; k_cache [blocks, bs, Hkv, D] fp8; v_si: to_slots_inner (the logical
    shape [blocks, bs, Hkv, D], slot stride 1)."""
    batch, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    out = torch.empty_like(q)
    group = hq // hkv
    _decode_swap_kernel[(batch, hkv)](
        q, k_cache, v_si, seq_lens, block_tables, out, scale * 1.4426950408889634 * k_scale,
        v_scale,
        q.stride(0), q.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_si.stride(0), v_si.stride(2), v_si.stride(3),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d,
        BLOCK_SIZE=bs, BLOCK_N=block_n, FP8_MMA=fp8_mma, num_warps=warps,
        **({"num_stages": stages} if stages else {}),
    )  # fmt: skip
    return out


def compile_check() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {
        "q_ptr": "*bf16", "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv",
        "seq_lens_ptr": "*i32", "block_tables_ptr": "*i32", "out_ptr": "*bf16",
        "qk_scale": "fp32", "v_scale": "fp32",
        **{n: "i32" for n in "stride_qt stride_qh stride_bt stride_k_block stride_k_slot "
           "stride_k_head stride_v_block stride_v_head stride_v_dim".split()},
        **{n: "constexpr" for n in "GROUP GROUP_PAD HEAD_DIM BLOCK_SIZE BLOCK_N FP8_MMA".split()},
    }  # fmt: skip
    aligned = [i for i, n in enumerate(sig) if sig[n].startswith("*") or n.startswith("stride_")
               and n not in ("stride_bt",)]  # fmt: skip
    for fp8_mma in (True, False):
        const = dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_N=128,
                     FP8_MMA=fp8_mma)  # fmt: skip
        attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
        src = ASTSource(_decode_swap_kernel, sig, constexprs=const, attrs=attrs)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm[
            "ptx"
        ]
        ops = sorted(set(re.findall(r"\b(wgmma\.mma_async[^ ]*|mma\.sync[^ ]*)", ptx)))
        print(
            json.dumps(
                {
                    "fp8_mma": fp8_mma,
                    "mma": ops,
                    "e4m3_cvt": len(re.findall(r"\bcvt\.[^;]*e4m3", ptx)),
                    "byte_smem_reads": len(re.findall(r"\bld\.shared\.[bsu]8\b", ptx)),
                }
            )
        )


def heads_outer(cache: torch.Tensor) -> torch.Tensor:
    """A copy with each block stored [heads, slots, dim] (one head's rows of a block contiguous),
    viewed in the logical [blocks, slots, heads, dim] shape the kernels index by strides."""
    blocks, bs, heads, dim = cache.shape
    out = torch.empty(blocks, heads, bs, dim, dtype=cache.dtype, device=cache.device)
    return out.permute(0, 2, 1, 3).copy_(cache)


def layouts() -> None:
    """The engine's decode kernel over K (and bf16 V) stored heads outer within each block."""
    from bench_attention import HEAD_DIM, median_ms, paged_inputs

    from bulkgen.model.attention.kv_layout import to_slots_inner
    from bulkgen.model.attention.triton_decode import paged_decode

    for dtype in (torch.float8_e4m3fn, torch.bfloat16):
        for batch, context in [(32, 2048), (256, 1024), (256, 2048), (512, 2048)]:
            q, k, v, meta, _ = paged_inputs([context] * batch, [1] * batch, True, dtype)
            fp8 = dtype != torch.bfloat16
            v_now = to_slots_inner(v) if fp8 else v
            sl, bt, sc = meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5
            want = paged_decode(q, k, v_now, sl, bt, sc)
            k_ho = heads_outer(k)
            v_ho = v_now if fp8 else heads_outer(v)
            got = paged_decode(q, k_ho, v_ho, sl, bt, sc)
            row = {"kv": str(dtype), "batch": batch, "context": context,
                   "now_ms": round(median_ms(partial(paged_decode, q, k, v_now, sl, bt, sc)), 4),
                   "heads_outer_ms": round(
                       median_ms(partial(paged_decode, q, k_ho, v_ho, sl, bt, sc)), 4
                   ),
                   "same": bool(torch.equal(want, got))}  # fmt: skip
            print(json.dumps(row), flush=True)


def block_sizes() -> None:
    """The engine's decode kernel (tuned launch, fp8 values slots inner) over caches of 16- and
    32-token blocks: a slots-inner block holds each dim's values of its tokens contiguous, 16
    bytes at 16 fp8 tokens (half an L2 sector), a whole 32-byte sector at 32."""
    import bench_attention
    from bench_attention import HEAD_DIM, median_ms, paged_inputs

    from bulkgen.model.attention.kv_layout import to_slots_inner
    from bulkgen.model.attention.triton_decode import paged_decode

    for dtype in (torch.float8_e4m3fn, torch.bfloat16):
        for batch, context in [(32, 2048), (256, 1024), (256, 2048), (512, 2048)]:
            row = {"kv": str(dtype), "batch": batch, "context": context}
            for bs in (16, 32, 64):
                bench_attention.BLOCK_SIZE = bs
                q, k, v, meta, _ = paged_inputs([context] * batch, [1] * batch, True, dtype)
                if dtype != torch.bfloat16:
                    v = to_slots_inner(v)
                sl, bt, sc = meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5
                paged_decode(q, k, v, sl, bt, sc)
                run = partial(paged_decode, q, k, v, sl, bt, sc)
                row[f"bs{bs}_ms"] = round(median_ms(run), 4)
            print(json.dumps(row), flush=True)
    bench_attention.BLOCK_SIZE = 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-sizes", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--layouts", action="store_true")
    args = ap.parse_args()
    if args.compile:
        compile_check()
        return
    if args.layouts:
        layouts()
        return
    if args.block_sizes:
        block_sizes()
        return
    from bench_attention import HEAD_DIM, median_ms, paged_inputs
    from bench_commit import git_commit

    from bulkgen.model.attention.kv_layout import to_slots_inner
    from bulkgen.model.attention.triton_decode import paged_decode

    torch.manual_seed(0)
    for batch, context in [(32, 1024), (32, 2048), (256, 1024), (256, 2048), (512, 2048)]:
        q, k, v, meta, _ = paged_inputs([context] * batch, [1] * batch, True, torch.float8_e4m3fn)
        v_si = to_slots_inner(v)
        sl, bt, sc = meta.seq_lens, meta.block_tables, HEAD_DIM**-0.5
        ref = paged_decode(q.float(), k.float(), v.float(), sl, bt, sc)
        row = {"batch": batch, "context": context, "git_commit": git_commit()}
        row["engine_ms"] = round(median_ms(partial(paged_decode, q, k, v_si, sl, bt, sc)), 4)
        row["engine_err"] = (paged_decode(q, k, v_si, sl, bt, sc).float() - ref).abs().max().item()
        for fp8_mma in (False, True):
            for warps, stages in ((4, None), (4, 2), (8, None)):
                name = f"swap_{'fp8' if fp8_mma else 'f16'}_w{warps}_s{stages}"
                try:
                    run = partial(decode_swap, q, k, v_si, sl, bt, sc, fp8_mma, 128, warps, stages)
                    row[name + "_ms"] = round(median_ms(run), 4)
                    row[name + "_err"] = (run().float() - ref).abs().max().item()
                except Exception as e:  # noqa: BLE001
                    row[name] = repr(e)[:160]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
