"""Teacher-forced accuracy of the FP8 and int8 KV caches against the model's own dtype.

    PYTHONPATH=. python scripts/accuracy_kv.py [--model smollm2-135m] [--device cuda] [--texts 42]
        [--kv-cache-dtype fp8,int8]

One JSON line per cache dtype, over the same texts and reference.
The fixed text set: the demo prompts (examples/prompts.jsonl) in the model's chat template,
each followed by the model's own greedy answer (--answer-tokens, generated with the model's
dtype in the KV cache). Each text then runs through the model once per cache dtype as one
prefill, whose attention reads every key and value back from the paged cache (write, then
attend), so position t's next-token distribution is computed from stored, and for fp8 or int8
rounded, keys and values of positions 0..t. Reported over every position: top-1 agreement (the
argmax is the same) and the mean KL divergence KL(reference || cache) of the next-token
distributions,
and the top-1 agreement over the positions that predict the answers' tokens alone.

On a CPU this runs the torch reference backend in float32 (fp8 storage is allowed here, for a
measurement, though `bulkgen run` refuses it there; int8 runs anywhere); on CUDA the Triton
kernels in bf16.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bulkgen import LLM, SamplingParams
from bulkgen.model.attention.kv_fp8 import FP8_MAX, resolve_kv_dtype
from bulkgen.model.attention.kv_layout import allocate_kv_cache
from bulkgen.model.attention.metadata import AttnMetadata

BLOCK_SIZE = 16
PROMPTS = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"


def texts(llm: LLM, count: int, answer_tokens: int) -> list[tuple[list[int], int]]:
    """Prompt (chat template) plus the model's greedy answer, as token ids, and the prompt's
    length."""
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()][:count]
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    params = SamplingParams(max_tokens=answer_tokens, temperature=0.0)
    outs = llm.chat(conversations, params)
    tok = llm.tokenizer
    ids = []
    for conversation, out in zip(conversations, outs, strict=True):
        prompt = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
        prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt  # as LLM.chat does
        ids.append((list(prompt) + list(out.token_ids), len(prompt)))
    return ids


@torch.inference_mode()
def next_token_logprobs(
    llm: LLM, ids: list[int], kv_dtype: torch.dtype, amax: torch.Tensor | None = None
) -> torch.Tensor:
    """[T, vocab] log-probabilities after each position, from one prefill over a fresh cache;
    amax ([layers, 2]), if given, is raised to each layer's largest |key| and |value|."""
    model, mcfg = llm.engine.runner.model, llm.engine.model_config
    device, n = llm.engine.device, len(ids)
    blocks = -(-n // BLOCK_SIZE)
    heads, dim = mcfg.num_kv_heads, mcfg.head_dim
    cache = allocate_kv_cache(mcfg.num_layers, blocks, BLOCK_SIZE, heads, dim, kv_dtype, device)
    meta = AttnMetadata(
        slot_mapping=torch.arange(n, device=device),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=device)[None],
        max_query_len=n,
        max_seq_len=n,
        decode_only=False,
        query_lens_host=[n],
        seq_lens_host=[n],
    )
    input_ids = torch.tensor(ids, device=device)
    positions = torch.arange(n, device=device)
    hidden = model(input_ids, positions, meta, cache.layers)
    if amax is not None:
        # rows layout: the first n tokens are the first n * heads * dim elements of K and of V
        seen = cache.values.flatten(2)[:, :, : n * heads * dim].float().abs().amax(dim=2)
        torch.maximum(amax, seen.cpu(), out=amax)
    # float32 before the softmax: bf16 log-probabilities would be rounded to ~3 digits.
    return torch.log_softmax(model.compute_logits(hidden).float(), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--texts", type=int, default=42)
    ap.add_argument("--answer-tokens", type=int, default=256)
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="per-layer scales amax / 448 from the reference pass of each text set (not the "
        "1.0 bulkgen uses), to see what calibrated scales would change (fp8 only)",
    )
    ap.add_argument("--kv-cache-dtype", default="fp8,int8", help="comma-separated: fp8, int8")
    args = ap.parse_args()
    t0 = time.perf_counter()
    llm = LLM(args.model, device=args.device, max_num_seqs=64)
    ref_dtype = llm.engine.dtype
    layers = [layer.self_attn for layer in llm.engine.runner.model.model.layers]
    amax = torch.zeros(len(layers), 2)
    all_ids = texts(llm, args.texts, args.answer_tokens)
    refs = [next_token_logprobs(llm, ids, ref_dtype, amax).float() for ids, _ in all_ids]
    if args.calibrate:
        for attention, (k_max, v_max) in zip(layers, amax.tolist(), strict=True):
            attention.k_scale, attention.v_scale = k_max / FP8_MAX, v_max / FP8_MAX
    fp8_scales = "amax/448 per layer" if args.calibrate else "1.0"
    for name in args.kv_cache_dtype.split(","):
        result = {
            "mode": f"kv-{name}",
            "model": args.model,
            "device": str(llm.engine.device),
            "dtype": str(ref_dtype).removeprefix("torch."),
            "attention": llm.engine.runner.attention.name,
            "texts": args.texts,
            "scales": "per (token, kv head)" if name == "int8" else fp8_scales,
            "largest_abs_key_value": round(float(amax.max()), 2),
            **compare(llm, all_ids, refs, resolve_kv_dtype(name, ref_dtype)),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(json.dumps(result), flush=True)


def compare(llm: LLM, all_ids, refs, kv_dtype: torch.dtype) -> dict:
    """Top-1 agreement and mean KL of a cache of kv_dtype against the reference log-probs."""
    agree = positions = answer_agree = answer_positions = 0
    kl_sum = 0.0
    for (ids, prompt_len), ref in zip(all_ids, refs, strict=True):
        got = next_token_logprobs(llm, ids, kv_dtype).float()
        same = ref.argmax(-1) == got.argmax(-1)
        agree += int(same.sum())
        # Positions from the last prompt token on predict the answer's tokens.
        answer_agree += int(same[prompt_len - 1 : -1].sum())
        answer_positions += len(ids) - prompt_len
        kl_sum += float((ref.exp() * (ref - got)).sum(-1).sum())
        positions += len(ids)
    return {
        "positions": positions,
        "top1_agreement": round(agree / positions, 5),
        "mean_kl": round(kl_sum / positions, 6),
        "answer_positions": answer_positions,
        "answer_top1_agreement": round(answer_agree / max(answer_positions, 1), 5),
    }


if __name__ == "__main__":
    main()
