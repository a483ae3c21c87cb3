"""Thread settings for a run on the CPU: every core on a quiet machine, one left over on a busy one.

torch's intra-op pool takes every core by default and its threads meet at a barrier after each
op. On a 2-core machine that other processes share, one descheduled thread stalls the other at
every op: the demo job (42 prompts, 32 tokens) took 119 s with torch's default 2 spinning threads
and 13.5 s with 1 while other work ran. On a quiet machine the second core is a gain instead
(README, Performance on the CPU). So the CLI looks once, before torch loads, at how busy the
machine's cores are over a tenth of a second (/proc/stat, this process asleep meanwhile):
- quiet (other processes busy less than QUIET_CORES of a core): the engine takes every core and
  OpenMP keeps its default wait policy (threads spin briefly at a barrier before sleeping);
- busy: all cores but one, and OpenMP threads wait passively (sleep, not spin): spinning threads
  take the cores a descheduled one needs (2 threads beside one busy process: 31.4 s spinning,
  15.0 s passive).
The tokenizers library's own thread pool is off either way: its batch encode would compete with
the engine for the same cores. OMP_NUM_THREADS and OMP_WAIT_POLICY, when set, win; the choice is
passed to the processes the run starts (BULKGEN_CPU_QUIET), so they agree.
"""

from __future__ import annotations

import os
import time

QUIET_CORES = 0.5  # other processes' busy cores below which the machine counts as quiet
_DECISION = "BULKGEN_CPU_QUIET"  # "1" / "0", set by before_torch for this process and its children


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def others_busy_cores(window_s: float = 0.1) -> float | None:
    """Cores' worth of busy time on the CPUs this process may use, over window_s while this
    process sleeps (so: other processes' work); None where /proc/stat cannot tell."""
    try:
        cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    except AttributeError:
        return None

    def sample() -> tuple[int, int]:
        busy = total = 0
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name in cpus:
                    ticks = [int(v) for v in fields[:8]]
                    idle = ticks[3] + ticks[4]  # idle, iowait
                    busy, total = busy + sum(ticks) - idle, total + sum(ticks)
        return busy, total

    try:
        busy0, total0 = sample()
        time.sleep(window_s)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (busy1 - busy0) / (total1 - total0) * len(cpus)


def machine_is_quiet() -> bool:
    """The decision of before_torch when it ran (in this process or the one that started it),
    else a look now; unknown counts as busy."""
    decided = os.environ.get(_DECISION)
    if decided in ("0", "1"):
        return decided == "1"
    busy = others_busy_cores()
    return busy is not None and busy < QUIET_CORES


def engine_threads(share: int = 1) -> int:
    """torch's intra-op threads for an engine on the CPU: OMP_NUM_THREADS, else every core on a
    quiet machine and all but one on a busy one, divided among `share` engines (the ranks of a
    tensor-parallel group on the CPU)."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    cores = available_cores() if machine_is_quiet() else available_cores() - 1
    return max(1, cores // max(1, share))


def before_torch() -> None:
    """Decide quiet or busy once, before torch loads OpenMP (which reads OMP_WAIT_POLICY once):
    on a busy machine OpenMP threads wait passively, unless OMP_WAIT_POLICY is set."""
    quiet = machine_is_quiet()
    os.environ[_DECISION] = "1" if quiet else "0"
    if not quiet:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def use_cpu_threads(share: int = 1) -> int:
    """Apply the CPU settings to this process (before the engine loads); returns the threads."""
    import torch

    threads = engine_threads(share)
    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return threads
