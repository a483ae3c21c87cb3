"""The GPU's time in each kind of step and its idle time between steps, for stats.json, read
from the GPU's own clock.

NVML's utilization (monitor.py) is the busy share of its own sample period, sampled every 50 ms,
so a short run's first and last samples and NVML's lag read as idle: blog runs of 13 s read
98.2-98.7% busy with no gap visible in their token counts. Here each step records a timing event
on the compute stream where its work begins (after the copy of its inputs) and where it ends (the
event the host waits for). From one step's end to the next one's beginning the stream had nothing
to run, the host not having launched it (or copied its inputs) yet. Summed, that is the run's
idle time between steps (gpu_step_gaps_s); gpu_gapless_pct is the share of the span from the
first step's beginning to the last one's end without it. Time when the engine had no request at
all (between LLM.generate calls, a pipeline waiting for rows) closes a segment and is not
counted; more than one segment says it happened. Idle time inside a step (an eager step launched
slower than the GPU runs it) is not seen here; NVML's figure includes it.

The same events time each step from its beginning to its end (gpu_decode_ms_per_step_*,
gpu_mixed_ms_per_step_*, their sums gpu_decode_steps_s and gpu_mixed_steps_s): where a run's GPU
time goes, decode steps or steps with prefill (idle time inside a step included). CUDA only: on
the CPU steps carry no events and the stats are empty.
"""

from __future__ import annotations

import torch

from bulkgen.engine.monitor import step_time_stats
from bulkgen.engine.step import Step
from bulkgen.engine.step_series import Series


def mark(stream: torch.cuda.Stream) -> torch.cuda.Event:
    """A timing event recorded on stream now (in stream order)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


class StepGaps:
    def __init__(self) -> None:
        self.first_begin = None  # the current segment's (steps while the engine had requests)
        self.last_done = None
        self.span_s = 0.0  # the closed segments'
        self.segments = 0
        # in bounded memory (step_series.py); gaps over 1 ms counted
        self.gaps = {"decode": Series(over=1e-3), "mixed": Series(over=1e-3)}  # by the next step
        self.steps = {"decode": Series(), "mixed": Series()}  # begin to done

    def add(self, step: Step) -> None:
        """A completed step (its done event has fired), steps in launch order; a step without
        events (the CPU) is skipped."""
        begin, done = step.begin, step.done
        if begin is None:
            return
        kind = "decode" if step.plan.decode_only else "mixed"
        if self.last_done is None:
            self.first_begin = begin
            self.segments += 1
        else:
            self.gaps[kind].append(self.last_done.elapsed_time(begin) / 1e3)
        self.steps[kind].append(begin.elapsed_time(done) / 1e3)
        self.last_done = done

    def pause(self) -> None:
        """The engine has no request left: the time until its next step is not between steps."""
        if self.last_done is not None:
            self.span_s += self.first_begin.elapsed_time(self.last_done) / 1e3
            self.first_begin = self.last_done = None

    @property
    def stats(self) -> dict:
        span_s = self.span_s
        if self.last_done is not None:
            span_s += self.first_begin.elapsed_time(self.last_done) / 1e3
        if not self.segments:
            return {}
        gaps = self.gaps.values()
        idle_s = sum(g.total for g in gaps)
        longest = max((g.max for g in gaps if g.count), default=0.0)
        return {
            "gpu_steps_span_s": round(span_s, 3),
            "gpu_step_gaps_s": round(idle_s, 4),
            "gpu_step_gaps_before_mixed_s": round(self.gaps["mixed"].total, 4),
            "gpu_step_gap_max_ms": round(longest * 1e3, 3),
            "gpu_step_gaps_over_1ms": sum(g.num_over for g in gaps),
            "gpu_gapless_pct": round(100 * (1 - idle_s / span_s), 2) if span_s > 0 else None,
            "gpu_step_segments": self.segments,  # > 1: the engine ran dry between them
            "gpu_decode_steps_s": round(self.steps["decode"].total, 4),
            "gpu_mixed_steps_s": round(self.steps["mixed"].total, 4),
            **step_time_stats(gpu_decode=self.steps["decode"], gpu_mixed=self.steps["mixed"]),
        }
