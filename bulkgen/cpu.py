"""Thread settings for a run on the CPU: one core left to the pipeline, no oversubscription.

torch's intra-op pool takes every core by default and its threads meet at a barrier after each
op; on a 2-core machine that the pipeline's own threads (tokenizer, detokenizer, writer) and other
processes share, one descheduled thread stalls the other at every op. Measured on the demo model
(42 prompts, 32 tokens, 2 cores shared with other work): 119 s with torch's default 2 threads,
13.5 s with 1 (scripts/bench_cpu.py; README, Performance on the CPU). So on the CPU the engine
gets all cores but one, and the tokenizers library's own thread pool is off: its batch encode
would compete with the engine for the same cores. OMP_NUM_THREADS, when set, wins.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def engine_threads() -> int:
    """torch's intra-op threads for an engine on the CPU: OMP_NUM_THREADS, else cores - 1."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, available_cores() - 1)


def before_torch() -> None:
    """OpenMP threads that wait passively (sleep, not spin) at torch's barriers, unless set:
    spinning threads take the cores a descheduled one needs (demo model, 2 threads, one busy
    process beside: 31.4 s spinning, 15.0 s passive). Read once, when torch loads OpenMP."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def use_cpu_threads() -> int:
    """Apply the CPU settings to this process (before the engine loads); returns the threads."""
    import torch

    threads = engine_threads()
    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return threads
