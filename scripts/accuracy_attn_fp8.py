"""Teacher-forced accuracy cost of FP8 *arithmetic* in attention (Q and/or P rounded to e4m3 for
FP8 tensor-core products) on top of the e4m3 KV cache, on the CPU; one JSON line per scheme.

    PYTHONPATH=. python scripts/accuracy_attn_fp8.py [--texts 12] [--tile 128] [--only "fp8 Q"]

Texts, prefill and references are accuracy_kv_schemes.py's: the float32 model, one prefill per
text over a float32 cache whose writes go through a quantize-dequantize (here e4m3, scale 1.0:
what bulkgen stores), references "fp32" (float32 cache) and "bf16" (bf16-rounded cache), and a
third, "fp8_kv": the fp8 cache with float32 arithmetic, so the arithmetic's own cost shows.

The arithmetic schemes replace the layers' attention with an emulation of an FP8 flash-decode
kernel, in float32 torch: every query row (each prefill position t, which is what decode
computes for t) attends to keys 0..t read back from the cache, as
- QK^T with fp8 Q: a scale per (token, q head) s_q = amax|q| / 448, q8 = e4m3(q / s_q), scores
  (q8 . k8) * s_q * softmax scale, against the stored e4m3 keys;
- P.V with fp8 P: flash attention's unnormalised p = exp2(s - m), m the running max after each
  --tile keys (--tile 0: the row's final max), rounded as e4m3(p * c) / c for c = 256 or 448,
  against the stored e4m3 values; earlier tiles' sums are rescaled by exp2(m_old - m_new) in
  float32, as the kernel rescales its accumulator;
- the row sum l from the float32 p (FA3) or, in "l from fp8 P", from the rounded p;
- "Q hi/lo" (decode_mma.py): q times the scores' scale held as two e4m3 parts per row, y / r =
  hi + lo / 16 with r a power of two putting the row's largest |y| in [128, 256).
Products accumulate in float32: an FP8 MMA's narrower accumulator (reported for Hopper) is
not modelled.
"fp8 KV" runs this emulation with no rounding and "fp8 KV (study's SDPA)" the backend's own
attention: both must reproduce accuracy_kv_schemes.py's "fp8 scale 1.0 (today)". They are not
equal to each other: float32 noise (summation order, ~1e-7) in one layer's output flips some
of the next layers' e4m3 roundings of K and V (one step: 1/16 to 1/8 of the value), so "fp8 KV"
against "fp8_kv" is the noise floor of any change to the arithmetic over an fp8 cache. The
"bf16 KV" schemes run the same arithmetic over a bf16 cache, where no such flips amplify it.
Per reference, per scheme: top1, mean_kl, clear_top1 (Tally in kv_agreement.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass

import torch
from accuracy_kv import next_token_logprobs, texts
from accuracy_kv_schemes import bf16, fixed, install, same
from kv_agreement import Tally
from kv_quant_schemes import E4M3, max_finite

from bulkgen import LLM
from bulkgen.model.attention.metadata import AttnMetadata

TOP = max_finite(E4M3)  # 448
LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Arithmetic:
    """Where the emulated kernel rounds to e4m3; all off is float32 attention."""

    fp8_q: bool = False
    q_split: bool = False  # q * scale as hi + lo / 16 e4m3 parts (decode_mma.py's query)
    p_scale: float | None = None  # P stored as e4m3(p * p_scale); None: P stays float32
    l_from_fp8_p: bool = False
    tile: int = 128  # keys between running-max updates; 0: one tile (the row's final max)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-TOP, TOP).to(E4M3).float()


def attend_one(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, arith: Arithmetic
) -> torch.Tensor:
    """Causal attention of q [Tq, Hq, D] (the last Tq positions) over k, v [S, Hkv, D]."""
    q_len, num_q_heads, head_dim = q.shape
    seq_len, num_kv_heads = k.shape[0], k.shape[1]
    group = num_q_heads // num_kv_heads
    q = q.float()
    q_scale = torch.ones(q_len, num_q_heads, 1)
    if arith.fp8_q:
        amax = q.abs().amax(-1, keepdim=True)
        q_scale = torch.where(amax > 0, amax / TOP, torch.ones_like(amax))
        q = e4m3(q / q_scale)
    if arith.q_split:  # the scores' scale goes into the parts, as the kernel's qk_scale does
        y = q * (scale * LOG2E)
        exponent = torch.frexp(y.abs().amax(-1, keepdim=True))[1] - 1 - 7
        row = torch.exp2(exponent.clamp(-126, 126).float())  # |y| / row in [128, 256)
        hi = e4m3(y / row)
        q = (hi + e4m3((y / row - hi) * 16) / 16) * row
        q_scale = q_scale / (scale * LOG2E)
    # [Hkv, G, Tq, D] @ [Hkv, 1, D, S]: scores in log2 units, as the kernel's exp2 takes them.
    qg = q.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    s = qg @ k.float().permute(1, 2, 0)[:, None]
    s = s * (q_scale.view(q_len, num_kv_heads, group).permute(1, 2, 0)[..., None] * scale * LOG2E)
    keys = torch.arange(seq_len)
    s = s.masked_fill(keys[None, :] > torch.arange(seq_len - q_len, seq_len)[:, None], -math.inf)
    # The running max m as the kernel holds it while a key's tile is processed: the max over
    # tiles 0..j (key 0 is visible to every row, so it is finite from tile 0 on).
    tile = arith.tile or seq_len
    tiles = -(-seq_len // tile)
    padded = torch.nn.functional.pad(s, (0, tiles * tile - seq_len), value=-math.inf)
    m_run = padded.view(*s.shape[:-1], tiles, tile).amax(-1).cummax(-1).values
    m_key = m_run.repeat_interleave(tile, dim=-1)[..., :seq_len]
    rescale = torch.exp2(m_key - m_run[..., -1:])  # exp2(m_j - m_final), applied in float32
    p = torch.exp2(s - m_key)
    p8 = p if arith.p_scale is None else e4m3(p * arith.p_scale) / arith.p_scale
    weights = p8 * rescale
    row_sum = (weights if arith.l_from_fp8_p else p * rescale).sum(-1, keepdim=True)
    out = (weights @ v.float().permute(1, 0, 2)[:, None]) / row_sum  # [Hkv, G, Tq, D]
    return out.permute(2, 0, 1, 3).reshape(q_len, num_q_heads, head_dim)


def emulated_attend(arith: Arithmetic):
    """An attend function (AttentionBackend.attend's signature) for a float32 cache whose
    contents are already the stored e4m3 values (install's quantize-dequantize writes)."""

    def attend(
        q, k_cache, v_cache, meta: AttnMetadata, scale: float, *_scales, out=None
    ) -> torch.Tensor:
        block_size, num_kv_heads, head_dim = k_cache.shape[1:]
        out, start = torch.empty_like(q) if out is None else out, 0
        for b, (q_len, seq_len) in enumerate(
            zip(meta.query_lens_host, meta.seq_lens_host, strict=True)
        ):
            blocks = meta.block_tables[b, : -(-seq_len // block_size)].long()
            k, v = (
                c.index_select(0, blocks).reshape(-1, num_kv_heads, head_dim)[:seq_len]
                for c in (k_cache, v_cache)
            )
            out[start : start + q_len] = attend_one(q[start : start + q_len], k, v, scale, arith)
            start += q_len
        return out

    return attend


def schemes(tile: int) -> list[tuple[str, str, Arithmetic | None]]:
    """(name, cache: "fp8_kv" or "bf16", arithmetic); None: the backend's own attention."""
    a = Arithmetic(tile=tile)
    q = dataclasses.replace(a, fp8_q=True)
    p256, p448 = (dataclasses.replace(a, p_scale=c) for c in (256.0, 448.0))
    l8 = {"l_from_fp8_p": True}
    split = dataclasses.replace(a, q_split=True)
    split_p = dataclasses.replace(split, p_scale=256.0)
    return [
        ("fp8 KV (study's SDPA)", "fp8_kv", None),
        ("fp8 KV", "fp8_kv", a),
        ("fp8 KV + fp8 Q", "fp8_kv", q),
        ("fp8 KV + fp8 P (x256)", "fp8_kv", p256),
        ("fp8 KV + fp8 P (x448)", "fp8_kv", p448),
        ("fp8 KV + fp8 P (x256), l from fp8 P", "fp8_kv", dataclasses.replace(p256, **l8)),
        ("fp8 KV + fp8 P (x448), l from fp8 P", "fp8_kv", dataclasses.replace(p448, **l8)),
        ("fp8 KV + fp8 Q + fp8 P (x256)", "fp8_kv", dataclasses.replace(q, p_scale=256.0)),
        ("fp8 KV + fp8 Q + fp8 P (x448)", "fp8_kv", dataclasses.replace(q, p_scale=448.0)),
        # decode_mma.py's arithmetic: the query in two e4m3 parts, P x256 in e4m3.
        ("Q hi/lo: fp8 KV + Q parts", "fp8_kv", split),
        ("Q hi/lo: fp8 KV + Q parts + fp8 P (x256)", "fp8_kv", split_p),
        ("Q hi/lo: bf16 KV + Q parts", "bf16", split),
        # The arithmetic alone, over a bf16 cache: no e4m3 cache roundings to flip.
        ("bf16 KV", "bf16", a),
        ("bf16 KV + fp8 Q", "bf16", q),
        ("bf16 KV + fp8 P (x256)", "bf16", p256),
        ("bf16 KV + fp8 Q + fp8 P (x256)", "bf16", dataclasses.replace(q, p_scale=256.0)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--texts", type=int, default=12)
    ap.add_argument("--answer-tokens", type=int, default=256)
    ap.add_argument("--tile", type=int, default=128, help="keys per running-max update; 0: one")
    ap.add_argument("--only", default="", help="comma-separated: schemes whose name contains one")
    args = ap.parse_args()
    t0 = time.perf_counter()
    llm = LLM(args.model, device="cpu", dtype="float32", max_num_seqs=64)
    n = llm.engine.model_config.num_layers
    layers = [layer.self_attn for layer in llm.engine.runner.model.model.layers]
    all_ids = texts(llm, args.texts, args.answer_tokens)
    fp8 = [fixed(1.0)] * n

    def run(k, v, ids, arith: Arithmetic | None = None) -> torch.Tensor:
        install(llm, k, v)  # restores the backend's own attend too
        if arith is not None:
            for attention in layers:
                attention.backend = dataclasses.replace(
                    attention.backend, attend=emulated_attend(arith)
                )
        return next_token_logprobs(llm, ids, torch.float32)

    caches = {"fp32": [same] * n, "bf16": [bf16] * n, "fp8_kv": fp8}
    # The references: each cache with the backend's own (float32) attention.
    refs = [{name: run(c, c, ids) for name, c in caches.items()} for ids, _ in all_ids]
    positions = sum(len(ids) for ids, _ in all_ids)
    header = {"texts": len(all_ids), "positions": positions, "tile": args.tile}
    print(json.dumps(header), flush=True)
    for name, cache, arith in schemes(args.tile):
        if not any(part in name for part in args.only.split(",")):
            continue
        tallies: dict[str, Tally] = {}
        for (ids, _), ref in zip(all_ids, refs, strict=True):
            got = run(caches[cache], caches[cache], ids, arith)
            for ref_name, r in ref.items():
                tallies.setdefault(ref_name, Tally()).add(r, got)
        line: dict = {"scheme": name}
        line |= {f"vs_{ref_name}": t.summary() for ref_name, t in tallies.items()}
        line["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
