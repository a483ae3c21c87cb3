"""The GPU's idle time between steps (engine/gpu_gaps.py), from timing events: the arithmetic on
events with known times here, the engine's real events in test_gpu_engine.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bulkgen.engine.gpu_gaps import StepGaps


class Event:
    """A completed timing event at t seconds (elapsed_time in ms, as torch.cuda.Event's)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def elapsed_time(self, end: Event) -> float:
        return (end.t - self.t) * 1e3


def step(begin: float, end: float, decode_only: bool = True):
    plan = SimpleNamespace(decode_only=decode_only)
    return SimpleNamespace(begin=Event(begin), done=Event(end), plan=plan)


def test_no_step_no_stats():
    gaps = StepGaps()
    gaps.add(SimpleNamespace(begin=None, done=None, plan=None))  # a CPU step: no events
    assert gaps.stats == {}


def test_gaps_between_steps_by_the_kind_of_step_after_them():
    gaps = StepGaps()
    for s in (step(0.0, 0.010), step(0.010, 0.020), step(0.025, 0.030, False), step(0.0302, 0.04)):
        gaps.add(s)
    st = gaps.stats
    assert st["gpu_steps_span_s"] == pytest.approx(0.040)
    assert st["gpu_step_gaps_s"] == pytest.approx(0.0052)
    assert st["gpu_step_gaps_before_mixed_s"] == pytest.approx(0.005)
    assert st["gpu_step_gap_max_ms"] == pytest.approx(5.0)
    assert st["gpu_step_gaps_over_1ms"] == 1
    assert st["gpu_gapless_pct"] == pytest.approx(87.0)
    assert st["gpu_step_segments"] == 1
    # The steps' own GPU time by kind; with the gaps it fills the span exactly.
    assert st["gpu_decode_steps_s"] == pytest.approx(0.0298)
    assert st["gpu_mixed_steps_s"] == pytest.approx(0.005)
    assert st["gpu_decode_ms_per_step_median"] == pytest.approx(10.0)
    assert st["gpu_mixed_ms_per_step_median"] == pytest.approx(5.0)
    total = st["gpu_decode_steps_s"] + st["gpu_mixed_steps_s"] + st["gpu_step_gaps_s"]
    assert total == pytest.approx(st["gpu_steps_span_s"])


def test_time_without_requests_is_not_a_gap():
    gaps = StepGaps()
    gaps.add(step(0.0, 0.010))
    gaps.add(step(0.012, 0.020))
    gaps.pause()  # e.g. between two LLM.generate calls
    gaps.pause()  # nothing launched since: no effect
    gaps.add(step(1.0, 1.010))
    gaps.add(step(1.011, 1.020))
    st = gaps.stats
    assert st["gpu_step_segments"] == 2
    assert st["gpu_steps_span_s"] == pytest.approx(0.040)
    assert st["gpu_step_gaps_s"] == pytest.approx(0.003)
    assert st["gpu_step_gap_max_ms"] == pytest.approx(2.0)
    assert st["gpu_gapless_pct"] == pytest.approx(92.5)
    assert st["gpu_decode_steps_s"] == pytest.approx(0.037), "the pause is in no step either"


def test_a_cpu_engine_reports_no_gpu_gaps(tiny_model_dir):
    from bulkgen import LLM, SamplingParams

    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    llm.generate(["Hello there"], SamplingParams(max_tokens=4, temperature=0.0))
    assert not [k for k in llm.engine.stats if k.startswith("gpu_step")]
