"""Teacher-forced accuracy of the FP8 KV cache against the model's own dtype; one JSON line.

    PYTHONPATH=. python scripts/accuracy_kv.py [--model smollm2-135m] [--device cuda] [--texts 42]

The fixed text set: the demo prompts (examples/prompts.jsonl) in the model's chat template,
each followed by the model's own greedy answer (--answer-tokens, generated with the model's
dtype in the KV cache). Each text then runs through the model once per cache dtype as one
prefill, whose attention reads every key and value back from the paged cache (write, then
attend), so position t's next-token distribution is computed from stored, and for fp8 rounded,
keys and values of positions 0..t. Reported over every position: top-1 agreement (the argmax
is the same) and the mean KL divergence KL(reference || fp8) of the next-token distributions.

On a CPU this runs the torch reference backend in float32 (fp8 storage is allowed here, for a
measurement, though `bulkgen run` refuses it there); on CUDA the Triton kernels in bf16.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bulkgen import LLM, SamplingParams
from bulkgen.model.attention.kv_fp8 import resolve_kv_dtype
from bulkgen.model.attention.metadata import AttnMetadata

BLOCK_SIZE = 16
PROMPTS = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"


def texts(llm: LLM, count: int, answer_tokens: int) -> list[list[int]]:
    """Prompt (chat template) plus the model's greedy answer, as token ids."""
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()][:count]
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    params = SamplingParams(max_tokens=answer_tokens, temperature=0.0)
    outs = llm.chat(conversations, params)
    tok = llm.tokenizer
    ids = []
    for conversation, out in zip(conversations, outs, strict=True):
        prompt = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
        prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt  # as LLM.chat does
        ids.append(list(prompt) + list(out.token_ids))
    return ids


@torch.inference_mode()
def next_token_logprobs(llm: LLM, ids: list[int], kv_dtype: torch.dtype) -> torch.Tensor:
    """[T, vocab] log-probabilities after each position, from one prefill over a fresh cache."""
    model, mcfg = llm.engine.runner.model, llm.engine.model_config
    device, n = llm.engine.device, len(ids)
    blocks = -(-n // BLOCK_SIZE)
    shape = (mcfg.num_layers, 2, blocks, BLOCK_SIZE, mcfg.num_kv_heads, mcfg.head_dim)
    cache = torch.empty(shape, dtype=kv_dtype, device=device)
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
    hidden = model(input_ids, positions, meta, [(layer[0], layer[1]) for layer in cache])
    return torch.log_softmax(model.compute_logits(hidden), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--texts", type=int, default=42)
    ap.add_argument("--answer-tokens", type=int, default=256)
    args = ap.parse_args()
    t0 = time.perf_counter()
    llm = LLM(args.model, device=args.device, max_num_seqs=64)
    ref_dtype = llm.engine.dtype
    fp8 = resolve_kv_dtype("fp8", ref_dtype)
    agree = positions = 0
    kl_sum = 0.0
    for ids in texts(llm, args.texts, args.answer_tokens):
        ref = next_token_logprobs(llm, ids, ref_dtype).float()
        got = next_token_logprobs(llm, ids, fp8).float()
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        kl_sum += float((ref.exp() * (ref - got)).sum(-1).sum())
        positions += len(ids)
    result = {
        "mode": "kv-fp8",
        "model": args.model,
        "device": str(llm.engine.device),
        "dtype": str(ref_dtype).removeprefix("torch."),
        "attention": llm.engine.runner.attention.name,
        "texts": args.texts,
        "positions": positions,
        "top1_agreement": round(agree / positions, 5),
        "mean_kl": round(kl_sum / positions, 6),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
