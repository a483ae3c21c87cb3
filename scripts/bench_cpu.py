"""bulkgen run against transformers' generate on the CPU, same model, same batch, same threads.

    python scripts/bench_cpu.py [--prompts examples/prompts.jsonl] [--max-tokens 64] [--repeats 3]
                                [--threads 1,2]

For each torch thread count and repeat, runs (back to back, each in a fresh process) `bulkgen run`
on the prompts (greedy, chat template, --max-tokens) and transformers' `generate` on the same
prompts as one left-padded batch, and prints one JSON line per run: generation wall time (model
load excluded: stats.json's wall_time_s for bulkgen), generated tokens and tokens/s. The demo
model (smollm2-135m) is the default; it must have been fetched once (`bulkgen run` does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_HF = """
import json, sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, prompts_file, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts = [json.loads(line)["prompt"] for line in open(prompts_file) if line.strip()]
tok = AutoTokenizer.from_pretrained(model_dir)
tok.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                 add_generation_prompt=True) for p in prompts]
batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
start = time.perf_counter()
with torch.inference_mode():
    out = model.generate(**batch, max_new_tokens=max_tokens, do_sample=False,
                         pad_token_id=tok.pad_token_id or 0)
wall = time.perf_counter() - start
new = out[:, batch["input_ids"].shape[1]:]
eos = tok.eos_token_id
tokens = 0
for row in new.tolist():
    tokens += next((i + 1 for i, t in enumerate(row) if t == eos), len(row))
print(json.dumps({"wall_s": wall, "tokens": tokens, "threads": torch.get_num_threads()}))
"""


def run_bulkgen(prompts: Path, model: str, max_tokens: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "bulkgen.cli", "run", str(prompts), "-m", model, "-o",
               str(out), "-q", "--max-tokens", str(max_tokens)]  # fmt: skip
        subprocess.run(cmd, env=env, cwd=REPO, check=True)
        stats = json.loads((out / "stats.json").read_text())
    return {"wall_s": stats["wall_time_s"], "tokens": stats["completion_tokens"]}


def run_transformers(prompts: Path, model_dir: str, max_tokens: int, env: dict) -> dict:
    cmd = [sys.executable, "-c", _HF, model_dir, str(prompts), str(max_tokens)]
    done = subprocess.run(cmd, env=env, cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", default=str(REPO / "examples" / "prompts.jsonl"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from bulkgen.model.hub import resolve_model

    model_dir = str(resolve_model(args.model))
    threads = [int(t) for t in args.threads.split(",") if t] or [None]
    for n in threads:
        env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
        if n is not None:
            env["OMP_NUM_THREADS"] = str(n)
        for repeat in range(args.repeats):
            for engine in ("bulkgen", "transformers"):
                run = run_bulkgen if engine == "bulkgen" else run_transformers
                started = time.time()
                result = run(Path(args.prompts), model_dir if engine != "bulkgen" else args.model,
                             args.max_tokens, env)  # fmt: skip
                result.update(engine=engine, omp_threads=n, repeat=repeat, at=started,
                              load_avg=os.getloadavg()[0])  # fmt: skip
                result["tok_s"] = round(result["tokens"] / result["wall_s"], 1)
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
