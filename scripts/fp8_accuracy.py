"""What FP8 costs in accuracy, on real weights (GPU): teacher-forced next-token distributions of
each FP8 mode against bf16 over fixed text sets (short, long, documents: see --sets).

    python scripts/fp8_accuracy.py [--model smollm2-135m] [--sets long,documents] [--modes int8-kv]
    python scripts/fp8_accuracy.py --device cpu --modes int8-kv   # the CPU runs bf16 and int8

For each mode (FP8 weights; FP8 KV cache; both; the int8 KV cache, alone and with FP8 weights)
the texts go through the engine's own model and KV cache as one prefill each (the attention
kernels read keys and values back from the cache, so an FP8 or int8 cache is what they attend
over), and every position's next-token distribution is compared
with bf16's: top1_agreement (same argmax), mean_kl (KL(bf16 || mode), nats, mean over
positions) with its standard error and each text's own agreement, and each side's accuracy at
predicting the text's actual next token. One JSON line per mode and set; a mode whose option
this bulkgen does not accept yet is a line with "skipped". The default model is the demo model
(SmolLM2-135M-Instruct): dummy weights say nothing about accuracy.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from bench_commit import git_commit

MODES = {
    "bf16": {},
    # FP8 GEMMs summing in the tensor cores' accumulator (cuBLASLt's use_fast_accum, the default
    # with FP8 weights): the GPU's own arithmetic, so only a GPU run says what it costs.
    "fp8-weights": {"quantization": "fp8"},
    "fp8-weights-exact": {"quantization": "fp8", "fp8_fast_accum": False},
    "fp8-kv": {"kv_cache_dtype": "fp8"},
    "fp8-kv-paired": {"kv_cache_dtype": "fp8", "fp8_kv_pair_first_block": True},  # kv_pairs.py
    "fp8-weights+kv": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
    # The int8 cache (a scale per token and kv head, kv_int8.py): the sibling of fp8-kv.
    "int8-kv": {"kv_cache_dtype": "int8"},
    "fp8-weights+int8-kv": {"quantization": "fp8", "kv_cache_dtype": "int8"},
}
MIN_BLOCK_SIZE, MAX_TOKENS = 16, 1024
# Positions from here on lie past a paired first block (kv_pairs.py: 64 tokens on the GPU), so
# most of what they attend over is stored in plain e4m3: the lines report them apart.
PAST = 64

TEXTS = [
    "The water cycle describes how water moves through the environment. Heat from the sun "
    "evaporates water from oceans, lakes and rivers. The vapour rises, cools and condenses into "
    "clouds. When the droplets grow heavy enough they fall as rain or snow, which flows back into "
    "rivers and seeps into the ground, where it may stay for thousands of years.",
    "To make a simple tomato sauce, warm two tablespoons of olive oil in a pan over medium heat. "
    "Add a chopped onion and cook it until soft, then stir in two cloves of garlic. Pour in a can "
    "of crushed tomatoes, season with salt and a pinch of sugar, and let it simmer for twenty "
    "minutes. Finish with fresh basil and serve it over pasta.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    "
    "return a\n\n\nprint([fibonacci(i) for i in range(10)])\n",
    "Dear Ms. Patel,\n\nThank you for your letter of 3 March. I am pleased to confirm that your "
    "order has been shipped and should arrive within five working days. If anything is missing "
    "or damaged, please reply to this message and we will send a replacement at no cost.\n\n"
    "Kind regards,\nThe customer service team",
    "User: What is the capital of France?\nAssistant: The capital of France is Paris. It is also "
    "the country's largest city, known for the Eiffel Tower, the Louvre museum and its cafes.\n"
    "User: And of Germany?\nAssistant: The capital of Germany is Berlin.",
    "Photosynthesis is the process by which green plants turn light into chemical energy. Inside "
    "the chloroplasts, chlorophyll absorbs sunlight and uses it to split water molecules, "
    "releasing oxygen. The energy is then used to build sugars from carbon dioxide taken from "
    "the air, which the plant uses to grow.",
    "In 1969 the Apollo 11 mission landed the first humans on the Moon. Neil Armstrong and Buzz "
    "Aldrin spent about two and a half hours walking on the surface, collecting rock samples and "
    "setting up experiments, while Michael Collins orbited above in the command module.",
    "A good night's sleep matters more than most people think. Adults need seven to nine hours. "
    "Keeping a regular schedule, avoiding screens before bed and limiting caffeine after noon "
    "all help. Exercise during the day improves sleep too, but not right before bedtime.",
    "The quick brown fox jumps over the lazy dog. This sentence contains every letter of the "
    "English alphabet, which is why typists and designers have used it for more than a century "
    "to test keyboards, typewriters and fonts.",
    "Step 1: Preheat the oven to 180 degrees Celsius.\nStep 2: Mix 200 g of flour, 100 g of "
    "sugar and two eggs in a bowl.\nStep 3: Add 100 ml of milk and stir until smooth.\nStep 4: "
    "Pour the batter into a greased tin and bake for 35 minutes.",
    "Machine learning models learn patterns from data instead of following hand-written rules. "
    "A model is trained by adjusting its parameters to reduce the error on examples, and it is "
    "evaluated on data it has not seen, to check that it generalises rather than memorises.",
    "The mitochondria is often called the powerhouse of the cell. It produces most of the "
    "chemical energy needed to power the cell's biochemical reactions, stored in a molecule "
    "called adenosine triphosphate, or ATP.",
    "SELECT name, COUNT(*) AS orders\nFROM customers JOIN orders ON orders.customer_id = "
    "customers.id\nWHERE orders.created_at >= '2024-01-01'\nGROUP BY name\nORDER BY orders DESC\n"
    "LIMIT 10;",
    "Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker. "
    "Every morning he opened his shop at seven, wound every clock on the wall, and waited for "
    "the children who came to watch the tiny wooden birds sing on the hour.",
    "Climate describes the average weather of a region over many years, while weather is what "
    "happens on a given day. A single cold winter does not disprove a warming climate, just as "
    "one hot afternoon does not prove it.",
    "The French Revolution began in 1789 and reshaped France's government and society. It ended "
    "the absolute monarchy, proclaimed the rights of man and of the citizen, and was followed by "
    "years of war and upheaval before Napoleon Bonaparte took power in 1799.",
]


def long_texts() -> list[str]:
    """The long set: the 16 texts joined into one document, in order and reversed (about 950
    tokens each). The short texts average 58 tokens, so a paired first block covers nearly all
    of each and the short set says little about a cache read at 1,000 tokens of context."""
    return ["\n\n".join(TEXTS), "\n\n".join(reversed(TEXTS))]


def documents() -> list[str]:
    """The documents set: six texts of about 1,000 tokens each, written for it and unlike the
    short texts (a history, instructions, a story with dialogue, a science explainer, a business
    report, a Python module; scripts/accuracy_documents.txt, "=====" lines between them): about
    6,000 positions, so that a top-1 agreement near 0.97 is told from it within about 0.002 (the
    long set's 1,922 positions leave 0.004)."""
    text = (Path(__file__).parent / "accuracy_documents.txt").read_text()
    return text.split("\n=====\n")


def engine_for(model_dir: str, options: dict, device: str):
    """An engine of the mode, or (None, why) when this bulkgen does not accept its options or
    the device cannot run them."""
    from bulkgen.config import EngineConfig
    from bulkgen.engine.engine import Engine

    try:
        config = EngineConfig(
            model=model_dir,
            dtype="bfloat16",
            device=device,
            # A small cache that still holds the warm-up's steps (at most MAX_TOKENS tokens),
            # in blocks of the engine's own size (an fp8 cache's on the GPU: 64 tokens, so its
            # paired first block is the one a run has).
            num_blocks=MAX_TOKENS // MIN_BLOCK_SIZE + 8,
            max_batch_tokens=MAX_TOKENS,
            max_num_seqs=4,
            cuda_graphs=False,
            **options,
        )
    except (TypeError, ValueError) as e:  # an option this version does not have
        return None, f"not accepted: {e}"
    try:
        return Engine(config), None
    except ValueError as e:  # FP8 on a device without it
        return None, str(e)


@torch.inference_mode()
def teacher_forced_logprobs(engine, ids: list[int]) -> torch.Tensor:
    """log-softmax of the next-token logits at every position of ids: [len(ids), vocab], from
    one prefill through the engine's model and KV cache (blocks 0.. in order; with paired first
    blocks, kv_pairs.py, block 0's partner is the cache's last block, as the engine pairs)."""
    runner, device = engine.runner, engine.device
    T, block_size = len(ids), engine.cfg.block_size
    blocks = -(-T // block_size)
    partners = runner.tables.partners
    if partners is not None:
        partners.fill_(-1)
        partners[0] = engine.stats["kv_blocks"] - 1
        assert blocks < engine.stats["kv_blocks"] - 1
    meta = runner.model.attention.metadata(
        torch.arange(T, device=device),  # slots: block b holds positions from b * block_size
        torch.tensor([0, T], dtype=torch.int32, device=device),
        torch.tensor([T], dtype=torch.int32, device=device),
        torch.arange(blocks, dtype=torch.int32, device=device)[None],
        [T],
        [T],
        partners,
    )
    input_ids = torch.tensor(ids, device=device)
    hidden = runner.model(input_ids, torch.arange(T, device=device), meta, runner.kv)
    return torch.log_softmax(runner.model.compute_logits(hidden), dim=-1)


def agreement(texts, logprobs, baseline) -> dict:
    """Top-1 agreement and mean KL against the baseline, over all positions and past PAST, and
    each side's accuracy at predicting the text's own next token."""
    sums = dict.fromkeys(("agree", "kl", "hits", "base_hits", "agree_past", "kl_past"), 0.0)
    by_text = []
    for ids, lp, ref in zip(texts, logprobs, baseline, strict=True):
        agree = lp.argmax(-1) == ref.argmax(-1)
        kl = (ref.exp() * (ref - lp)).sum(-1).clamp(min=0)
        agreed = agree.sum().item()
        sums["agree"] += agreed
        by_text.append(round(agreed / len(agree), 4))
        sums["kl"] += kl.sum().item()
        sums["agree_past"] += agree[PAST:].sum().item()
        sums["kl_past"] += kl[PAST:].sum().item()
        truth = torch.tensor(ids[1:], device=lp.device)
        sums["hits"] += (lp[:-1].argmax(-1) == truth).sum().item()
        sums["base_hits"] += (ref[:-1].argmax(-1) == truth).sum().item()
    positions = sum(len(ids) for ids in texts)
    past = sum(max(len(ids) - PAST, 0) for ids in texts)
    top1 = sums["agree"] / positions
    return {
        "texts": len(texts),
        "positions": positions,
        "top1_agreement": round(top1, 4),
        # The binomial standard error, as if positions were independent (they are not: a lower
        # bound), and each text's own agreement, whose spread says more.
        "top1_se": round(math.sqrt(top1 * (1 - top1) / positions), 4),
        "top1_by_text": by_text if len(texts) <= 8 else None,
        "mean_kl": round(sums["kl"] / positions, 5),
        f"positions_past_{PAST}": past,
        f"top1_past_{PAST}": round(sums["agree_past"] / past, 4) if past else None,
        f"mean_kl_past_{PAST}": round(sums["kl_past"] / past, 5) if past else None,
        "next_token_acc": round(sums["hits"] / (positions - len(texts)), 4),
        "bf16_next_token_acc": round(sums["base_hits"] / (positions - len(texts)), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model folder or an alias")
    ap.add_argument("--device", default="cuda", help="cpu runs the bf16 baseline and int8-kv only")
    ap.add_argument(
        "--sets",
        default="short,long,documents",
        help="text sets: short (16 texts), long (those joined: 2 documents), documents (6 others)",
    )
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated; bf16 always runs")
    args = ap.parse_args()
    from bulkgen.engine.model_files import model_dir
    from bulkgen.text.tokenizer import load_tokenizer

    folder = str(model_dir(args.model))
    tokenizer = load_tokenizer(folder)
    sets = {"short": TEXTS, "long": long_texts(), "documents": documents()}
    sets = {name: sets[name] for name in args.sets.split(",")}
    texts = {
        name: [tokenizer(t)["input_ids"][:MAX_TOKENS] for t in ts] for name, ts in sets.items()
    }
    baseline = {}
    for mode in ["bf16", *(m for m in args.modes.split(",") if m != "bf16")]:
        options = MODES[mode]
        engine, why = engine_for(folder, options, args.device)
        if engine is None:
            print(json.dumps({"mode": mode, "options": options, "skipped": why}), flush=True)
            continue
        for name, ids_set in texts.items():
            logprobs = [teacher_forced_logprobs(engine, ids) for ids in ids_set]
            baseline.setdefault(name, logprobs)
            line = {"mode": mode, "options": options, "model": args.model, "set": name}
            line |= agreement(ids_set, logprobs, baseline[name])
            line |= {
                "quantization": engine.stats.get("quantization"),
                "kv_cache_dtype": engine.stats.get("kv_cache_dtype"),
                "fp8_kv_pair_first_block": engine.stats.get("fp8_kv_pair_first_block"),
                "block_size": engine.cfg.block_size,
                "git_commit": git_commit(),
            }
            print(json.dumps(line), flush=True)
        engine.close()
        del engine
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
