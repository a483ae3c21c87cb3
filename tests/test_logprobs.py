"""--logprobs K: the sampled token's logprob and the top K per position, as list columns."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from test_pipeline import chat_ids, make_config, output, write_jsonl

from bulkgen.config import SamplingParams
from bulkgen.pipeline import run

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]


def generate(tmp_path, model_dir, logprobs, fmt="parquet"):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": p}
                                              for i, p in enumerate(PROMPTS)])  # fmt: skip
    sampling = SamplingParams(max_tokens=6, temperature=0.0, logprobs=logprobs)
    config = make_config(tmp_path, model_dir, [path], sampling=sampling, device="cpu", format=fmt,
                         overwrite=True)  # fmt: skip
    run(config)
    return {r["id"]: r for r in output(tmp_path / "out")}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_logprobs_are_log_softmax_of_transformers_logits(tmp_path, tiny_model_dir,
                                                         tiny_tokenizer, fmt):  # fmt: skip
    from transformers import AutoModelForCausalLM

    rows = generate(tmp_path, tiny_model_dir, 3, fmt)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for i, prompt in enumerate(PROMPTS):
        row = rows[str(i)]
        assert len(row["logprobs"]) == len(row["top_logprobs"]) == row["completion_tokens"]
        ids = chat_ids(tiny_tokenizer, prompt)
        with torch.no_grad():
            logp = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
        first = logp.argmax().item()  # greedy: the sampled token is the most likely one
        assert row["logprobs"][0] == pytest.approx(logp[first].item(), abs=1e-4)
        values, top_ids = logp.topk(3)
        top = row["top_logprobs"][0]
        assert [t["token_id"] for t in top] == top_ids.tolist()
        assert [t["logprob"] for t in top] == pytest.approx(values.tolist(), abs=1e-4)
        assert [t["token"] for t in top] == [tiny_tokenizer.decode([t]) for t in top_ids.tolist()]
        # Greedy: each position's sampled logprob is its top-1.
        assert row["logprobs"] == pytest.approx([p[0]["logprob"] for p in row["top_logprobs"]])


def test_logprobs_zero_stores_the_sampled_token_only(tmp_path, tiny_model_dir):
    rows = generate(tmp_path, tiny_model_dir, 0, "jsonl")
    for row in rows.values():
        assert len(row["logprobs"]) == row["completion_tokens"]
        assert all(lp <= 0 for lp in row["logprobs"])
        assert row["top_logprobs"] == [[] for _ in row["logprobs"]]


def test_without_logprobs_there_are_no_logprob_columns(tmp_path, tiny_model_dir):
    generate(tmp_path, tiny_model_dir, None)
    names = pq.read_schema(next((tmp_path / "out").glob("part-*.parquet"))).names
    assert "logprobs" not in names and "top_logprobs" not in names


def reachable(obj: object) -> list[object]:
    """Every object a full collection reaches from obj (types and modules aside)."""
    import gc
    import types

    seen, todo = {id(obj): obj}, [obj]
    while todo:
        for o in gc.get_referents(todo.pop()):
            if id(o) not in seen and not isinstance(o, type | types.ModuleType):
                seen[id(o)] = o
                todo.append(o)
    return list(seen.values())


def test_the_llm_api_gives_lists_of_pairs_from_storage_the_gc_never_traverses(tiny_model_dir):
    """A full collection visits every object the GC tracks and each reference it holds: a
    finished request's logprobs are untracked numpy arrays over flat buffers, the same few
    objects whatever its length, and RequestOutput.logprobs / top_logprobs build the documented
    lists from them."""
    import gc

    from bulkgen import LLM

    llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu")
    try:
        params = [
            SamplingParams(max_tokens=n, temperature=0.0, logprobs=3, ignore_eos=True)
            for n in (12, 2)
        ]
        out, short = llm.generate([[5, 6, 7, 8], [9, 10]], params)
    finally:
        llm.close()
    store = out.token_logprobs
    assert [len(a) for a in store.columns()] == [12, 36, 36]
    assert not any(gc.is_tracked(a) for a in store.columns())
    assert len(reachable(store)) == len(reachable(short.token_logprobs)) < 20
    assert isinstance(out.logprobs, list) and len(out.logprobs) == 12
    assert all(type(v) is float for v in out.logprobs)
    for token, chosen, top in zip(out.token_ids, out.logprobs, out.top_logprobs, strict=True):
        assert len(top) == 3 and all(type(i) is int and type(v) is float for i, v in top)
        assert top[0] == (token, chosen), "greedy: the sampled token is the most likely"
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
