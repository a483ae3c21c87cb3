"""How scripts/bench.py measures the device: ceilings, NVML sampling, a kernel profile window."""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

import numpy as np


def measure_ceilings() -> dict:
    import torch

    ceilings = _ceilings()
    torch.cuda.empty_cache()  # the engines run in child processes: leave them the memory
    return ceilings


def _ceilings() -> dict:
    import torch

    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def timed(fn, n):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(n):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return float(np.median(times))

    copy_s = timed(lambda: y.copy_(x), 20)
    mm_s = timed(lambda: a @ b, 20)
    return {
        "copy_bw_gbs": round(2 * x.numel() / copy_s / 1e9, 1),
        "bf16_tflops": round(2 * 8192**3 / mm_s / 1e12, 1),
    }


class Sampler:
    """NVML utilisation (the mean over `gpus`) and generated-token count every 50 ms, in a
    background thread."""

    def __init__(
        self, count_tokens, profile_at: float | None = None, gpus=None, idle_stacks: bool = False
    ) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        gpus = gpus if gpus is not None else [int(os.environ.get("BENCH_GPU", "0"))]
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in gpus]
        self.count_tokens = count_tokens
        self.series: list[tuple[float, int, int]] = []
        self.profile_at = profile_at
        self.profile: dict = {}
        # Where the engine thread is whenever NVML says the GPU was idle mid-run (diagnostic).
        self.idle_stacks: collections.Counter | None = (
            collections.Counter() if idle_stacks else None
        )
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        t0 = time.perf_counter()
        while not self.done.wait(0.05):
            rates = [self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
            util = sum(rates) / len(rates)
            tokens = self.count_tokens()
            self.series.append((time.perf_counter() - t0, util, tokens))
            if self.idle_stacks is not None and util == 0 and tokens > 0:
                self.idle_stacks[engine_stack()] += 1
            if self.profile_at is not None and time.perf_counter() - t0 > self.profile_at:
                self.profile_at = None
                self.profile = profile_window(0.4)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    @property
    def busy(self) -> float:
        return self.busy_after(0.0)

    def busy_after(self, start: float, end: float = float("inf")) -> float:
        """Mean utilisation of the samples from `start` seconds on (until `end`)."""
        rates = [u for t, u, _ in self.series if start <= t <= end]
        return float(np.mean(rates)) if rates else float("nan")

    @property
    def busy_run(self) -> float | None:
        """Mean utilisation from NVML's first busy sample to its last: the GPU's busy share
        while the run worked. NVML reports the busy share of its own last sample period, so its
        readings trail the GPU by about that period at both ends (at 0cbf7c0 a trt run read 0 for
        four samples while its first tokens came, and 100 for two after its last); `busy` also
        counts the pipeline's start before the first step (0.65-0.86 s of a trt run at 0cbf7c0)."""
        busy = [i for i, (_, util, _) in enumerate(self.series) if util > 0]
        if not busy:
            return None
        return float(np.mean([u for _, u, _ in self.series[busy[0] : busy[-1] + 1]]))

    @property
    def first_token_s(self) -> float | None:
        """Seconds from the sampler's start (the engine's, in bench runs) to the first token
        counted, at the sampling's 50 ms resolution: the pipeline's start."""
        return next((t for t, _, tokens in self.series if tokens > 0), None)

    @property
    def max_idle_gap_s(self) -> float:
        """The longest run of samples in which NVML saw the GPU idle and the token count did not
        move, between the first and the last token counted (a mid-run compile or a host stall;
        the 50 ms sampling bounds its resolution). NVML's utilisation is the busy share of its
        own last sample period, so as a run starts it reads 0 while the first steps already
        produce tokens: a trt run's first four samples at 0cbf7c0 read 0 while its count rose
        2, 6, 12, 12, which the old rule reported as a 0.15 s gap."""
        final = self.series[-1][2] if self.series else 0
        longest, start, before = 0.0, None, None
        for t, util, tokens in self.series:
            if util == 0 and 0 < tokens < final and tokens == before:
                start = t if start is None else start
                longest = max(longest, t - start)
            else:
                start = None
            before = tokens
        return round(longest, 3)


def env_fields() -> dict:
    """{"env": {name: value}} of the BULKGEN_* switches set for the run (engine_stats'
    env_overrides), or {} without any: each bench line says its setting."""
    from bulkgen.engine.engine_stats import env_overrides  # the parent's: as its children's

    env = env_overrides()
    return {"env": env} if env else {}


def engine_stack() -> str:
    """The engine thread's innermost frame and its nearest frames outside Triton, one line; for
    a Triton JIT compile, the kernel and its specialisation key too."""
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if names.get(ident) != "bulkgen-engine":
            continue
        frames, compiling, f = [], "", frame
        while f is not None:
            frames.append(f)
            if f.f_code.co_name == "_do_compile" and not compiling:
                kernel = getattr(f.f_locals.get("self"), "__name__", "?")
                compiling = f"compiling {kernel} key={str(f.f_locals.get('key'))[:600]} | "
            f = f.f_back
        shown = [frames[0]] + [
            x for x in frames[1:] if f"{os.sep}triton{os.sep}" not in x.f_code.co_filename
        ][:3]
        where = " <- ".join(
            f"{os.path.basename(x.f_code.co_filename)}:{x.f_lineno} {x.f_code.co_name}"
            for x in shown
        )
        return compiling + where
    return "(no engine thread)"


def profile_window(seconds: float) -> dict:
    """Kernel-level GPU busy (union of kernel intervals), the idle gaps between kernels and the
    top kernels over a short window.

    Run from the sampler thread: CUPTI records every kernel of the process, whichever thread
    launched it.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            time.sleep(seconds)
        spans = sorted(
            (e.time_range.start, e.time_range.end, e.name)
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA
        )
        busy, gaps = kernel_gaps(spans)
        window = (spans[-1][1] - spans[0][0]) if spans else 0.0
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
        return {
            "kernel_busy": round(100 * busy / window, 2) if window else None,
            "kernels": len(spans),
            "window_us": window,
            "table": table + "\n" + gap_report(gaps, window),
        }
    except Exception as e:  # the profile is an extra; never lose the benchmark over it
        return {"error": repr(e)}


def kernel_gaps(spans: list[tuple[float, float, str]]) -> tuple[float, list]:
    """Busy time (the union of the kernel intervals) and every idle gap between them, as
    (gap, name of the kernel before it, name of the kernel after it); spans sorted by start."""
    busy, gaps, cur_start, cur_end, cur_name = 0.0, [], None, None, ""
    for start, end, name in spans:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
                gaps.append((start - cur_end, cur_name, name))
            cur_start, cur_end, cur_name = start, end, name
        elif end > cur_end:
            cur_end, cur_name = end, name
    if cur_end is not None:
        busy += cur_end - cur_start
    return busy, gaps


GAP_BUCKETS_US = (5, 20, 100, 1000)


def gap_report(gaps: list, window: float) -> str:
    """Idle time between kernels by gap size, and the largest gaps with their neighbours: where a
    run's idle GPU time goes (a host stall, a sync, a launch queue that ran dry)."""
    lines = [f"idle between kernels: {sum(g for g, _, _ in gaps):.0f} us of {window:.0f} us"]
    low = 0
    for high in (*GAP_BUCKETS_US, float("inf")):
        inside = [g for g, _, _ in gaps if low <= g < high]
        lines.append(f"  gaps {low}-{high} us: {len(inside)}, {sum(inside):.0f} us")
        low = high
    for gap, before, after in sorted(gaps, reverse=True)[:8]:
        lines.append(f"  {gap:.0f} us after {before[:60]} before {after[:60]}")
    return "\n".join(lines)


def save_series(runs: dict, out) -> None:
    """Each run's NVML samples as they are ([seconds since the engine loaded, busy %, tokens
    generated], in out/series.json: where a run's idle samples lie) and their plot (bench.png)."""
    (out / "series.json").write_text(json.dumps(runs))
    plot(runs, out / "bench.png")


def plot(runs: dict, path) -> None:
    """A PNG of tokens/s and GPU busy over time, one line per run (its NVML series)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for label, series in runs.items():
        if len(series) < 3:
            continue
        t = np.array([s[0] for s in series])
        util = np.array([s[1] for s in series])
        tok = np.array([s[2] for s in series], dtype=float)
        if not tok.any():
            continue
        rate = np.gradient(tok, t)
        ax1.plot(t, rate, label=label)
        ax2.plot(t, util, label=label)
    ax1.set_ylabel("generated tokens/s")
    ax2.set_ylabel("GPU busy (NVML %)")
    ax2.set_xlabel("seconds into the timed region")
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
