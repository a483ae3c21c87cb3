"""engine/interface.py: the real engine and the fake one both have every member the pipeline's
engine thread calls (stages.generate probes for none)."""

from __future__ import annotations

from bulkgen import SamplingParams
from bulkgen.engine.engine import Engine
from bulkgen.engine.fake import FakeEngine
from bulkgen.engine.interface import GenerationEngine

MEMBERS = sorted(name for name in vars(GenerationEngine) if not name.startswith("_"))


def test_the_interface_names_what_the_engine_thread_calls():
    assert MEMBERS == ["abort", "add", "close", "num_unfinished", "stats", "step", "take_progress"]


def test_both_engines_have_every_member():
    for cls in (Engine, FakeEngine):
        assert [name for name in MEMBERS if not hasattr(cls, name)] == [], cls.__name__


def test_the_fake_engine_streams_nothing():
    engine = FakeEngine(steps=2)
    engine.add("0", [5, 6, 7], SamplingParams(max_tokens=4))
    assert engine.step() == [] and engine.take_progress() == []
    assert [o.token_ids for o in engine.step()] == [[7, 6, 5]]
