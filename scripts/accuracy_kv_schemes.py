"""Teacher-forced accuracy of KV-cache storage schemes (fp8 scale schemes, e5m2, Hadamard, int8)
against a bf16 and a float32 cache, on the CPU; one JSON line per scheme.

    PYTHONPATH=. python scripts/accuracy_kv_schemes.py [--texts 12] [--bf16-model]

Texts and prefill are accuracy_kv.py's (chat prompt plus the float32 model's greedy answer, one
prefill each, attending over keys and values read back from the cache), or --fp8-accuracy-set's.
Every scheme runs the float32 model over a float32 cache whose writes go through the scheme's
quantize-dequantize (kv_quant_schemes.py). References: "fp32" (float32 cache), "bf16" (the GPU's
cache); against each, kv_agreement.Tally's summary. "fp8 K only" / "V only": the other half
bf16; "first N tokens bf16": each text's first N positions at 16 bits (attention sinks;
bytes_per_token leaves them out: they cost bytes per sequence, not per token). --bf16-model adds
the bf16 model's runs (the H200's configurations) and a third reference, "bf16_model".
Calibrated scales (per layer, or layer and kv head) come from the float32 pass over the same
texts: the best case (in-sample). bytes_per_token counts the cache on this model (and a float32
scale per token and kv head where a scheme has one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from accuracy_kv import next_token_logprobs, texts
from kv_agreement import CLEAR, NEAR_TIE, Tally
from kv_quant_schemes import (
    E4M3,
    E5M2,
    first_kept,
    first_split,
    fp8_fixed,
    fp8_per_token,
    int8_per_token,
    max_finite,
    own_mean_centred,
    recorder,
    rotated,
)

from bulkgen import LLM

Quantizer = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Scheme:
    name: str
    k: Sequence[Quantizer]  # one per layer
    v: Sequence[Quantizer]
    bytes_per_element: float  # of the stored keys and values
    # float32 scales per token and kv head, counted as if both K and V had one (K only: 2).
    scale_bytes_per_head: int = 0
    model: str = "fp32"


def same(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def fixed(scale: float, dtype: torch.dtype = E4M3) -> Quantizer:
    return lambda x: fp8_fixed(x, scale, dtype)


def pow2_at_least(x: float) -> float:
    return 2.0 ** math.ceil(math.log2(x))


def schemes(amax: torch.Tensor, mean: torch.Tensor, bf16_model: bool) -> list[Scheme]:
    """amax: [layers, 2 (K, V), kv heads] largest |x| in the float32 pass; mean: [layers, 2,
    kv heads, D] the mean over its tokens."""
    n = amax.shape[0]

    def per_layer(make: Callable[[int, int], Quantizer], kind: int) -> list[Quantizer]:
        return [make(layer, kind) for layer in range(n)]

    def both(q: Quantizer, nbytes: float, name: str, scale_bytes: int = 0) -> Scheme:
        return Scheme(name, [q] * n, [q] * n, nbytes, scale_bytes)

    top = max_finite(E4M3)
    layer_amax = lambda layer, kind: fixed(float(amax[layer, kind].max()) / top)  # noqa: E731
    layer_pow2 = lambda layer, kind: fixed(pow2_at_least(float(amax[layer, kind].max()) / top))  # noqa: E731

    def head_amax(layer: int, kind: int) -> Quantizer:
        scale = (amax[layer, kind] / top).clamp(min=1e-12)[:, None]  # [Hkv, 1] over [T, Hkv, D]
        return lambda x: fp8_fixed(x, scale, E4M3)

    def centred(layer: int, quantizer: Quantizer) -> Quantizer:
        # Every key of a context shifted by one vector mu shifts a query's scores by the same
        # q . mu, which the softmax cancels: the cache may store k - mu (no bytes, exact), and
        # the rounding then scales with |k - mu|, not with the keys' common offset.
        mu = mean[layer, 0]
        return lambda x: quantizer(x.float() - mu) + mu

    k_centred = [centred(layer, fixed(1.0)) for layer in range(n)]
    k_centred_token = [centred(layer, fp8_per_token) for layer in range(n)]
    out = [
        both(bf16, 2, "bf16"),
        both(fixed(1.0), 1, "fp8 scale 1.0 (today)"),
        Scheme("fp8 K only, scale 1.0", [fixed(1.0)] * n, [bf16] * n, 1.5),
        Scheme("fp8 V only, scale 1.0", [bf16] * n, [fixed(1.0)] * n, 1.5),
    ]
    out += [both(fixed(2.0**e), 1, f"fp8 scale 2^{e}") for e in (-4, -2, 2, 4)]
    out += [
        Scheme("fp8 per-layer amax/448", per_layer(layer_amax, 0), per_layer(layer_amax, 1), 1),
        Scheme(
            "fp8 per-layer pow2 >= amax/448", per_layer(layer_pow2, 0), per_layer(layer_pow2, 1), 1
        ),
        Scheme(
            "fp8 per-(layer, head) amax/448", per_layer(head_amax, 0), per_layer(head_amax, 1), 1
        ),
        both(fp8_per_token, 1, "fp8 per-token-head", 4),
        both(fixed(1.0, E5M2), 1, "e5m2 scale 1.0"),
        both(lambda x: fp8_per_token(x, E5M2), 1, "e5m2 per-token-head", 4),
        Scheme(
            "fp8 per-token, K Hadamard", [rotated(fp8_per_token)] * n, [fp8_per_token] * n, 1, 4
        ),
        both(rotated(fp8_per_token), 1, "fp8 per-token, K+V Hadamard", 4),
        Scheme("fp8 per-token K only", [fp8_per_token] * n, [bf16] * n, 1.5, 2),
        Scheme("fp8 K+Hadamard only", [rotated(fp8_per_token)] * n, [bf16] * n, 1.5, 2),
        Scheme("fp8 K - mean, scale 1.0", k_centred, [fixed(1.0)] * n, 1),
        Scheme("fp8 K - mean, per-token-head", k_centred_token, [fp8_per_token] * n, 1, 4),
        Scheme("fp8 K - mean only, scale 1.0", k_centred, [bf16] * n, 1.5),
        Scheme(
            "fp8 per-token, K - mean + Hadamard, V Hadamard",
            [centred(layer, rotated(fp8_per_token)) for layer in range(n)],
            [rotated(fp8_per_token)] * n,
            1,
            4,
        ),
        Scheme(
            "int8 K, fp8 V, per-token, K+V Hadamard",
            [rotated(int8_per_token)] * n,
            [rotated(fp8_per_token)] * n,
            1,
            4,
        ),
        *(
            both(first_kept(count, fixed(1.0)), 1, f"fp8 scale 1.0, first {count} tokens bf16")
            for count in (1, 4, 16, 64)
        ),
        Scheme(
            "fp8 K - mean, per-token-head, first 16 tokens bf16",
            [first_kept(16, q) for q in k_centred_token],
            [first_kept(16, fp8_per_token)] * n,
            1,
            4,
        ),
        Scheme(
            "fp8 K - own mean, per-token-head, first 16 tokens bf16",
            [first_kept(16, own_mean_centred(fp8_per_token))] * n,
            [first_kept(16, fp8_per_token)] * n,
            1,
            4,
        ),
        both(first_kept(16, fp8_per_token), 1, "fp8 per-token-head, first 16 tokens bf16", 4),
        Scheme(
            "fp8 K - own mean, scale 1.0, first 16 tokens bf16",
            [first_kept(16, own_mean_centred(fixed(1.0)))] * n,
            [first_kept(16, fixed(1.0))] * n,
            1,
        ),
        Scheme(  # the mean of positions 16-31 only: a function of the first two blocks
            "fp8 K - own mean of block 1, scale 1.0, first 16 tokens bf16",
            [first_kept(16, own_mean_centred(fixed(1.0), 16, 32))] * n,
            [first_kept(16, fixed(1.0))] * n,
            1,
        ),
        both(int8_per_token, 1, "int8 per-token-head", 4),
        both(rotated(int8_per_token), 1, "int8 per-token-head, K+V Hadamard", 4),
    ]
    if bf16_model:  # the H200's configurations (scripts/fp8_accuracy.py measures the first two)
        kept, centred = first_kept(16, fixed(1.0)), first_kept(16, own_mean_centred(fixed(1.0)))
        own = Scheme("fp8 K - own mean, scale 1.0, first 16 bf16", [centred] * n, [kept] * n, 1)
        int8_own = own_mean_centred(int8_per_token)  # int8 keys centred: each row's step shrinks
        out += [
            dataclasses.replace(scheme, name=f"bf16 model, {scheme.name}", model="bf16")
            for scheme in (
                both(same, 2, "bf16 cache"),
                both(fixed(1.0), 1, "fp8 scale 1.0"),
                both(kept, 1, "fp8 scale 1.0, first 16 tokens bf16"),
                both(first_kept(64, fixed(1.0)), 1, "fp8 scale 1.0, first 64 tokens bf16"),
                both(first_split(64, fixed(1.0)), 1, "fp8 scale 1.0, first 64 tokens hi/lo"),
                own,
                both(int8_per_token, 1, "int8 per-token-head", 4),
                *(
                    Scheme(f"int8, K - own mean{x}", [k] * n, [int8_per_token] * n, 1, 4)
                    for x, k in (("", int8_own), (", first 16 K bf16", first_kept(16, int8_own)))
                ),
            )
        ]
    return out


def install(llm: LLM, k: Sequence[Quantizer], v: Sequence[Quantizer]) -> None:
    """Route each layer's cache writes through its quantizers (the cache stays float32)."""
    for layer, quant_k, quant_v in zip(llm.engine.runner.model.model.layers, k, v, strict=True):
        attention = layer.self_attn
        base = getattr(attention, "_plain_backend", attention.backend)
        attention._plain_backend = base

        def write_kv(k_, v_, k_cache, v_cache, slots, *_scales, qk=quant_k, qv=quant_v, b=base):
            b.write_kv(qk(k_).to(k_.dtype), qv(v_).to(v_.dtype), k_cache, v_cache, slots)

        attention.backend = dataclasses.replace(base, write_kv=write_kv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--texts", type=int, default=12)
    ap.add_argument("--answer-tokens", type=int, default=256)
    ap.add_argument("--bf16-model", action="store_true", help="add the bf16 model's runs")
    ap.add_argument(
        "--only", default="", help="comma-separated: run the schemes whose name contains one"
    )
    ap.add_argument(
        "--fp8-accuracy-set",
        choices=("short", "long", "documents"),
        help="measure on scripts/fp8_accuracy.py's short set (16 texts, the H200's accuracy "
        "table), long set (those joined) or documents (6) instead of prompts and answers",
    )
    ap.add_argument(
        "--holdout",
        action="store_true",
        help="calibrate (amax, K mean) on the first --texts prompts and measure on the next "
        "--texts, so calibrated schemes are not measured on their own calibration data",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    llms = {"fp32": LLM(args.model, device="cpu", dtype="float32", max_num_seqs=64)}
    if args.bf16_model:
        llms["bf16"] = LLM(args.model, device="cpu", dtype="bfloat16", max_num_seqs=64)
    mcfg = llms["fp32"].engine.model_config
    n, heads = mcfg.num_layers, mcfg.num_kv_heads
    all_ids = texts(llms["fp32"], args.texts * (2 if args.holdout else 1), args.answer_tokens)
    calibration = all_ids[: args.texts]
    all_ids = all_ids[-args.texts :]
    if args.fp8_accuracy_set:  # calibrated on the prompts above (held out)
        from fp8_accuracy import MAX_TOKENS, TEXTS, documents, long_texts

        chosen = {"short": TEXTS, "long": long_texts(), "documents": documents()}
        chosen, tokenize = chosen[args.fp8_accuracy_set], llms["fp32"].tokenizer
        all_ids = [(tokenize(t)["input_ids"][:MAX_TOKENS], 0) for t in chosen]

    def run(scheme_k, scheme_v, ids, model="fp32") -> torch.Tensor:
        install(llms[model], scheme_k, scheme_v)
        return next_token_logprobs(llms[model], ids, torch.float32)

    amax = torch.zeros(n, 2, heads)
    sums = torch.zeros(n, 2, heads, mcfg.head_dim + 1)
    rec = [[recorder(amax, sums, i, kind) for i in range(n)] for kind in (0, 1)]
    if args.holdout:
        for ids, _ in calibration:
            run(*rec, ids)
        rec = [[same] * n] * 2
    refs_per_text = []
    for ids, _ in all_ids:  # without --holdout the float32 pass also calibrates
        refs = {"fp32": run(*rec, ids), "bf16": run([bf16] * n, [bf16] * n, ids)}
        if args.bf16_model:
            refs["bf16_model"] = run([same] * n, [same] * n, ids, "bf16")
        refs_per_text.append(refs)
    margins = torch.cat([r["bf16"].topk(2, -1).values.diff(dim=-1).neg() for r in refs_per_text])
    print(json.dumps({
        "reference": "bf16 cache, float32 model",
        "texts": len(all_ids),
        "calibrated_on": "other texts (the prompts before)" if args.holdout else "the same texts",
        "positions": len(margins),
        "share_margin_lt_0.1": round(float((margins < NEAR_TIE).float().mean()), 4),
        "share_margin_ge_0.5": round(float((margins >= CLEAR).float().mean()), 4),
        "largest_abs_key": round(float(amax[:, 0].max()), 2),
        "largest_abs_value": round(float(amax[:, 1].max()), 2),
    }), flush=True)  # fmt: skip
    elements = 2 * n * heads * mcfg.head_dim  # K and V per token
    for scheme in schemes(amax, sums[..., :-1] / sums[..., -1:], args.bf16_model):
        if not any(part in scheme.name for part in args.only.split(",")):
            continue
        tallies: dict[str, Tally] = {}
        for (ids, _), refs in zip(all_ids, refs_per_text, strict=True):
            got = run(scheme.k, scheme.v, ids, scheme.model)
            for name, ref in refs.items():
                tallies.setdefault(name, Tally()).add(ref, got)
        nbytes = elements * scheme.bytes_per_element + 2 * n * heads * scheme.scale_bytes_per_head
        line = {"scheme": scheme.name, "bytes_per_token": int(nbytes)}
        line |= {f"vs_{name}": t.summary() for name, t in tallies.items()}
        line["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
