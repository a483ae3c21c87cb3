"""A process that builds one engine after another (a notebook, an eval looping over models) gets
the first one's memory back: its startup freeze does not keep it alive."""

from __future__ import annotations

import gc
import weakref

from bulkgen import LLM
from bulkgen.config import SamplingParams
from bulkgen.engine.gc_policy import collect_frozen_garbage, survivors_frozen


def test_a_dropped_cpu_engine_is_freed_at_once(tiny_model_dir):
    first = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    assert gc.get_freeze_count() > 0, "the engine froze its startup objects"
    model = weakref.ref(first.engine.runner.model)
    del first
    assert model() is None, "no reference cycle holds a CPU engine"


def test_a_frozen_engine_in_a_reference_cycle_is_collected_for_the_next_one(tiny_model_dir):
    first = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    first.engine.itself = first.engine  # garbage that only a collection frees
    model = weakref.ref(first.engine.runner.model)
    del first
    gc.collect()
    assert model() is not None, "frozen: out of the collector's reach"
    collect_frozen_garbage()  # what a CUDA engine's start does first (release_dead_engines)
    assert model() is None


def _tracked(obj) -> bool:
    """Whether a collection of any generation would walk obj (frozen objects are in none)."""
    return any(o is obj for gen in range(3) for o in gc.get_objects(gen))


def test_what_survives_an_older_generations_collection_is_frozen_while_a_run_generates():
    gc.collect()
    with survivors_frozen():
        prompt = list(range(1_000))  # a row's token ids: a list the collector visits item by item
        assert _tracked(prompt)
        gc.collect(0)
        assert _tracked(prompt), "a young collection leaves it to the collector"
        gc.collect(1)
        assert not _tracked(prompt), "frozen once it survived a collection of generation 1"
        later = [prompt]
        gc.collect(2)
        assert not _tracked(later), "and so is whatever survives a full one"
        holder = _Holder()
        freed = weakref.ref(holder)
        gc.collect(1)
        assert not _tracked(holder)
        del holder
        assert freed() is None, "a frozen object still goes when its last reference does"
    gc.unfreeze()  # the rest of the suite's collections as they were (the startup freezes too)
    gc.freeze()


def test_the_hook_is_gone_after_the_block_and_objects_are_left_to_the_collector():
    callbacks = list(gc.callbacks)
    with survivors_frozen():
        assert len(gc.callbacks) == len(callbacks) + 1
    assert gc.callbacks == callbacks
    gc.collect()
    young = [[1]]
    gc.collect(1)
    assert _tracked(young), "outside a run, survivors are not frozen"


def test_a_pipeline_run_leaves_no_hook_behind(tiny_model_dir, tmp_path):
    import json

    from bulkgen.pipeline import run
    from bulkgen.run_config import RunConfig

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"count to {i}"}) + "\n" for i in range(3)))
    callbacks = list(gc.callbacks)
    config = RunConfig(
        inputs=(str(prompts),),
        out=str(tmp_path / "out"),
        model=str(tiny_model_dir),
        sampling=SamplingParams(max_tokens=4, temperature=0.0),
        quiet=True,
        device="cpu",
    )
    stats = run(config)
    assert (stats["rows"], stats["errors"]) == (3, 0)
    assert [cb for cb in gc.callbacks if cb not in callbacks and not hasattr(cb, "pauses")] == []


class _Holder:
    pass


def test_a_queued_prompt_is_left_out_of_full_collections(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    engine = llm.engine
    engine.add("r", list(range(3, 40)), SamplingParams(max_tokens=2, temperature=0.0))
    prompt = engine._requests["r"].prompt_ids
    gc.collect(0)  # a young collection sees it holds only ints
    assert not gc.is_tracked(prompt), "no collection walks its ids again"
    finished = []
    while engine.num_unfinished:
        finished += engine.step()
    assert finished[0].prompt_token_ids == list(range(3, 40))
    assert isinstance(finished[0].prompt_token_ids, list)
