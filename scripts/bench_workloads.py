"""What scripts/bench.py measures, and its ideal: the workloads (token-id prompts and output
lengths) and their HBM roofline on the Llama-3-8B shape (or the 70B one, --shape 70b)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from bulkgen.model.shapes import LLAMA3_8B as _LLAMA3_8B
from bulkgen.model.shapes import SHAPES

LLAMA3_8B = dict(_LLAMA3_8B)


def kv_bytes_per_token(c: dict, kv_fp8: bool = False) -> int:
    """K and V of every layer, bf16 (one byte an element with an FP8 cache)."""
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * (1 if kv_fp8 else 2)


def weight_bytes_read(c: dict = LLAMA3_8B, fp8_weights: bool = False) -> float:
    """Bytes of weights a decode step reads: everything but the embedding table (gathered).
    fp8_weights: the projections at one byte a weight (norms and lm_head stay bf16)."""
    h, i, layers, v = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_hidden_layers"],
        c["vocab_size"],
    )
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    projections = layers * (h * (h + 2 * kv) + h * h + 2 * h * i + i * h)
    return (1.0 if fp8_weights else 2.0) * projections + 2.0 * (layers * 2 * h + h + v * h)


_WORDS = (
    "the of and to in is was for on that with as by at from his her they this which be are had"
    " have not but or an were their one all we there been if more when will would who so no time"
    " people year way day man thing woman life child world school state family student group"
    " country problem hand part place case week company system program question work government"
    " number night point home water room mother area money story fact month lot right study book"
    " eye job word business issue side kind head house service friend father power hour game line"
    " end member law car city community name president team minute idea kid body information back"
    " parent face others level office door health person art war history party result change"
    " morning reason research girl guy moment air teacher force education write explain describe"
    " compare summarize analyze imagine consider improve build learn teach measure design plan"
    " quickly carefully often rarely always never today tomorrow yesterday because although while"
).split()


def text_prompts(n: int, rng: np.random.Generator) -> list[str]:
    """English-like prompts of 40-400 words: sentences of 6-18 common words."""
    prompts = []
    for _ in range(n):
        words, sentences = int(rng.integers(40, 401)), []
        while words > 0:
            k = min(words, int(rng.integers(6, 19)))
            picked = [_WORDS[i] for i in rng.integers(0, len(_WORDS), k)]
            sentences.append(" ".join(picked).capitalize() + ".")
            words -= k
        prompts.append(" ".join(sentences))
    return prompts


def make_workload(name: str, out_len: int, num_prompts: int | None) -> list[tuple[object, int]]:
    """(prompt, output length) pairs. Prompts are token ids drawn from the ordinary vocabulary,
    except in `text`, whose prompts are English-like text that bulkgen wraps in the chat template
    and tokenizes (as a user's job does)."""
    rng = np.random.default_rng(0)
    if name == "text":
        n = num_prompts or 2048
        return [(p, out_len) for p in text_prompts(n, rng)]
    if name == "blog":
        n = num_prompts or 32
        return [(rng.integers(1000, 120000, 256).tolist(), out_len) for _ in range(n)]
    if name == "bulk":
        n = num_prompts or 1024
        plens, olens = rng.integers(64, 1025, n), rng.integers(64, 1025, n)
        pairs = zip(plens, olens, strict=True)
        return [(rng.integers(1000, 120000, p).tolist(), int(o)) for p, o in pairs]
    if name == "trt":  # TensorRT-LLM's own 1000/1000 case (trtllm-bench perf-overview)
        n = num_prompts or 3000
        return [(rng.integers(1000, 120000, 1000).tolist(), 1000) for _ in range(n)]
    if name == "prefix":
        n = num_prompts or 1024
        prefix = rng.integers(1000, 120000, 1024).tolist()
        own, olens = rng.integers(64, 257, n), rng.integers(128, 513, n)
        pairs = zip(own, olens, strict=True)
        return [(prefix + rng.integers(1000, 120000, p).tolist(), int(o)) for p, o in pairs]
    raise ValueError(name)


def roofline_terms(
    work,
    bandwidth: float,
    flops_rate: float,
    max_num_seqs: int,
    shape: dict = LLAMA3_8B,
    fp8_weights: bool = False,
    kv_fp8: bool = False,
) -> dict[str, float]:
    """Seconds of a run's ideal parts: reading the weights once a decode step, the decode GEMMs'
    FLOPs, reading the live KV cache, and the prefill's FLOPs. fp8_weights: FP8 weight bytes and
    twice the bf16 FLOP rate (FP8 tensor cores); kv_fp8: FP8 KV bytes. For a tensor-parallel
    group pass its GPUs' summed bandwidth and FLOP rate."""
    outs = [o for _, o in work]
    steps = max(max(outs), sum(outs) / max_num_seqs)
    per_token = kv_bytes_per_token(shape, kv_fp8)
    kv = sum(per_token * (len(p) * o + o * (o - 1) / 2) for p, o in work)
    params = weight_bytes_read(shape) / 2
    rate = flops_rate * (2 if fp8_weights else 1)
    return {
        "weights": steps * weight_bytes_read(shape, fp8_weights) / bandwidth,
        "decode_gemms": 2 * params * sum(outs) / rate,
        "kv": kv / bandwidth,
        "prefill": sum(2 * params * len(p) for p, _ in work) / rate,
    }


def roofline_s(work, *rate, **options) -> float:
    """Decode bytes (weights once per step plus live KV) over bandwidth, plus prefill FLOPs
    (roofline_terms' arguments)."""
    t = roofline_terms(work, *rate, **options)
    return t["weights"] + t["kv"] + t["prefill"]


def roofline_compute_s(work, *rate, **options) -> float:
    """roofline_s with the decode GEMMs' FLOPs counted too: each decode step's GEMMs take at least
    the longer of reading the weights and computing its rows' products (2 * params FLOPs a
    token), so over the run they take at least the longer of the two sums (a sum of maxima is at
    least the maximum of the sums). At a few hundred rows a step the 8B decode GEMMs are
    compute-bound, which roofline_s does not see."""
    t = roofline_terms(work, *rate, **options)
    return max(t["weights"], t["decode_gemms"]) + t["kv"] + t["prefill"]


def split_roofline_s(
    work,
    workers: int,
    args,
    max_num_seqs: int,
    tp: int = 1,
    shape: dict = LLAMA3_8B,
    roofline=roofline_s,
    **fp8,
) -> float:
    """The roofline (roofline_s, or roofline_compute_s) of each worker's even share of the rows,
    at most max_num_seqs rows a step: `bulkgen run --data-parallel` hands rows out as workers
    have room, so no worker has more than its share of the work left; a worker of tp GPUs has tp
    times one GPU's bandwidth and FLOP rate. fp8: roofline_terms' fp8_weights and kv_fp8."""
    shares = [work[k::workers] for k in range(workers)]
    rate = tp * args.bandwidth, tp * args.flops, max_num_seqs
    return max(roofline(share, *rate, shape, **fp8) for share in shares if share)


def model_folder(tokenizer_dir: Path, shape: str = "8b") -> Path:
    """A model folder: the shape's config plus the carried tokenizer (weights come from dummy)."""
    folder = Path(tempfile.mkdtemp(prefix=f"bulkgen-{shape}-"))
    (folder / "config.json").write_text(json.dumps(dict(SHAPES[shape])))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009]}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_dir / name).is_file():
            (folder / name).write_bytes((tokenizer_dir / name).read_bytes())
    return folder
