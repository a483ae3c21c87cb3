"""Summarize a py-spy raw profile (`py-spy record --threads --format raw`, with --gil: only the
thread holding the interpreter is sampled) of a bulkgen run: samples per thread, the engine
thread's samples by step phase, and each thread's hottest leaf frames. Answers "who holds the
interpreter while the engine thread wants it" (issue 10's in-run host time per step).

    py-spy record --subprocesses --threads --gil --rate 250 --format raw -o gil.txt -- \\
        bulkgen run prompts.parquet --model M --out out/
    python scripts/spy_summary.py gil.txt

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import re

# The engine thread's phases, by the first of these frames found in a stack (outermost first).
PHASES = (
    ("schedule", "Scheduler.schedule"),
    ("pack", "InputPacker.pack"),
    ("forward", "ModelRunner.forward_packed"),
    ("sample", "ModelRunner.sample"),
    ("wait", "Step.synchronize"),
    ("update", "Scheduler.update"),
    ("stop_strings", "Engine.take_progress"),
)

# Stacks outside the run (imports, loading, warm-up, the job's checks and its tokenizer's load;
# bench.py's ceilings, workloads and plots) are counted apart: the question is the run. At
# 1b6e621 the main thread's preflight (the tokenizer's load) counted as the run's. Samples
# without a Python frame (native code holding the interpreter, when is unknown) are apart too.
STARTUP = {
    "Engine.__init__",
    "_find_and_load",
    "checked_parts",
    "measure_ceilings",
    "PreTrainedTokenizerBase.from_pretrained",
    "make_workload",
    "plot",
}


def parse(lines) -> list[tuple[str, list[str], int]]:
    """(thread name, frames outermost first, samples) of each raw line."""
    rows = []
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread (")), "thread (?)")
        name = thread.split(": ", 1)[-1] if ": " in thread else thread
        rest = frames[frames.index(thread) + 1 :] if thread in frames else frames
        rows.append((name, [re.sub(r" \(.*\)$", "", f) for f in rest], int(count)))
    return rows


def summarize(rows, engine_thread: str, top: int) -> dict:
    threads: collections.Counter = collections.Counter()
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    phases: collections.Counter = collections.Counter()
    startup = native = 0
    for name, frames, count in rows:
        if any(f in STARTUP for f in frames):
            startup += count
            continue
        if not frames:
            native += count
            continue
        threads[name] += count
        leaves[name][frames[-1] if frames else "?"] += count
        if name == engine_thread:
            phase = next((p for p, fn in PHASES for f in frames if f == fn), "other")
            phases[phase] += count
    total = sum(threads.values()) or 1
    return {
        "samples": total,
        "startup_samples": startup,
        "no_python_frame_samples": native,
        "thread_share": {t: round(c / total, 3) for t, c in threads.most_common()},
        "engine_phase_share": {
            p: round(c / (threads[engine_thread] or 1), 3) for p, c in phases.most_common()
        },
        "top_leaves": {t: leaves[t].most_common(top) for t, _ in threads.most_common(6)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("raw", help="py-spy's raw output (--format raw)")
    ap.add_argument("--engine-thread", default="bulkgen-engine")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    with open(args.raw) as f:
        print(json.dumps(summarize(parse(f), args.engine_thread, args.top)))


if __name__ == "__main__":
    main()
