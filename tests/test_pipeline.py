"""The pipeline end to end with the FakeEngine stand-in (and, at the end, the real engine)."""

from __future__ import annotations

import gzip
import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkgen.config import SamplingParams
from bulkgen.engine.fake import FakeEngine
from bulkgen.errors import UserError
from bulkgen.pipeline import run
from bulkgen.run_config import RunConfig
from bulkgen.text.template import ChatTemplate

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child.",
    "def add(a, b):",
]


class RecordingEngine(FakeEngine):
    """A FakeEngine that remembers what it was given."""

    instances: list[RecordingEngine] = []

    def __init__(self, config, **kw) -> None:
        super().__init__(config, **kw)
        self.added: dict[str, tuple[list[int], SamplingParams]] = {}
        self.most_unfinished = 0
        self.thread = threading.current_thread()
        RecordingEngine.instances.append(self)

    def add(self, request_id, prompt_ids, params) -> None:
        assert threading.current_thread() is self.thread, "only the engine thread calls it"
        self.added[request_id] = (list(prompt_ids), params)
        super().add(request_id, prompt_ids, params)
        self.most_unfinished = max(self.most_unfinished, self.num_unfinished)


def factory(**kw):
    RecordingEngine.instances = []
    return lambda config: RecordingEngine(config, **kw)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def output(out_dir) -> list[dict]:
    rows = []
    for path in sorted(out_dir.glob("part-*")):
        if path.suffix == ".parquet":
            rows += pq.read_table(path).to_pylist()
        else:
            rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def make_config(tmp_path, model_dir, inputs, **kw):
    kw.setdefault("quiet", True)
    return RunConfig(inputs=tuple(str(i) for i in inputs), out=str(tmp_path / "out"),
                     model=str(model_dir), **kw)  # fmt: skip


def chat_ids(tokenizer, prompt):
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True
    )["input_ids"]


def test_every_row_is_written_once_with_its_own_completion(
    tmp_path, tiny_model_dir, tiny_tokenizer
):
    records = [{"id": f"q{i}", "prompt": f"{PROMPTS[i % 4]} ({i})"} for i in range(300)]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    config = make_config(tmp_path, tiny_model_dir, [path], shard_size=64, max_num_seqs=8)
    stats = run(config, factory(steps=3))
    rows = output(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in records)
    assert len(list((tmp_path / "out").glob("part-*.parquet"))) == 5
    by_id = {r["id"]: r for r in rows}
    for record in records[:20]:
        ids = chat_ids(tiny_tokenizer, record["prompt"])
        row = by_id[record["id"]]
        # The FakeEngine answers with the prompt's ids reversed.
        assert row["text"] == tiny_tokenizer.decode(ids[::-1][:256], skip_special_tokens=True)
        assert (row["prompt"], row["prompt_tokens"]) == (record["prompt"], len(ids))
        assert row["finish_reason"] == "stop" and row["error"] is None
    assert stats["rows"] == 300 and stats["errors"] == 0
    assert stats["completion_tokens"] == sum(r["completion_tokens"] for r in rows)


def test_prompts_are_tokenized_like_transformers_does(tmp_path, tiny_model_dir, tiny_tokenizer):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in PROMPTS])
    run(make_config(tmp_path, tiny_model_dir, [path]), factory())
    sent = [ids for ids, _ in RecordingEngine.instances[0].added.values()]
    assert sent == [chat_ids(tiny_tokenizer, p) for p in PROMPTS]
    config = make_config(tmp_path, tiny_model_dir, [path], chat_template=False, overwrite=True)
    run(config, factory())
    sent = [ids for ids, _ in RecordingEngine.instances[0].added.values()]
    assert sent == [tiny_tokenizer(p)["input_ids"] for p in PROMPTS]


def test_the_template_shortcut_renders_like_the_template(tiny_tokenizer):
    template = ChatTemplate(tiny_tokenizer)
    assert template.affix is not None
    awkward = ["x", " lead and trail ", "{{ not jinja }}", "a\nb", "<|user|>inner"]
    assert template.render(awkward) == [template._render_one(p) for p in awkward]


def test_a_template_that_changes_the_content_is_rendered_per_row(tiny_tokenizer):
    class Stripping:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "<u>" + messages[0]["content"].strip() + "</u>"

    template = ChatTemplate(Stripping())
    assert template.affix is None
    assert template.render([" a "]) == ["<u>a</u>"]


def test_each_kind_of_bad_row_becomes_an_error_record(tmp_path, tiny_model_dir):
    path = tmp_path / "in.jsonl"
    lines = [
        '{"id": "good", "prompt": "Hello"}',
        '{"id": "broken", "prompt": ',
        '{"id": "null", "prompt": null}',
        '{"id": "missing", "text": "no prompt"}',
        '{"id": "empty", "prompt": ""}',
        '{"id": "number", "prompt": 3.5}',
        '{"id": "dict", "prompt": {"role": "user"}}',
        '{"id": "long", "prompt": "' + "word " * 200 + '"}',
        '{"id": "good2", "prompt": "Bye"}',
    ]
    path.write_text("\n".join(lines) + "\n")
    stats = run(make_config(tmp_path, tiny_model_dir, [path]), factory(max_model_len=64))
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert set(rows) == {"good", "in:1", "null", "missing", "empty", "number", "dict", "long",
                         "good2"}  # fmt: skip
    errors = {k: r["error"] for k, r in rows.items() if r["finish_reason"] == "error"}
    assert errors == {
        "in:1": "row 1, line 2: not valid JSON: Expecting value",
        "null": "prompt is null",
        "missing": "row 3, line 4: no 'prompt' field",
        "empty": "prompt is empty",
        "number": "prompt is float 3.5, not a string or a list of token ids",
        "dict": "prompt is dict {'role': 'user'}, not a string or a list of token ids",
        "long": errors["long"],
    }
    assert "context" in errors["long"] and rows["long"]["text"] is None
    assert rows["good"]["finish_reason"] == rows["good2"]["finish_reason"] == "stop"
    assert stats["errors"] == 7 and stats["rows"] == 9


def test_pretokenized_prompts_go_to_the_engine_as_they_are(
    tmp_path, tiny_model_dir, tiny_tokenizer
):
    path = tmp_path / "in.parquet"
    prompts = [[5, 6, 7, 8], [9, 10], [0, 100000]]
    pq.write_table(pa.table({"prompt": prompts, "topic": ["a", "b", "c"]}), path)
    config = make_config(tmp_path, tiny_model_dir, [path], keep_columns=("topic",), format="jsonl")
    run(config, factory())
    sent = [ids for ids, _ in RecordingEngine.instances[0].added.values()]
    assert sent == prompts[:2]
    rows = {r["id"]: r for r in output(tmp_path / "out")}
    assert rows["in:0"]["prompt"] == tiny_tokenizer.decode([5, 6, 7, 8])
    assert rows["in:1"]["topic"] == "b"
    assert rows["in:2"]["error"].startswith("prompt token id 100000 is outside the vocabulary")


def test_a_failing_engine_stops_the_pipeline_promptly(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p {i}"} for i in range(20000)])
    config = make_config(tmp_path, tiny_model_dir, [path], shard_size=50, max_num_seqs=16)
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="failed on purpose"):
        run(config, factory(steps=1, fail_after_steps=200, step_delay=0.001))
    assert time.perf_counter() - start < 30
    assert RecordingEngine.instances[0].closed
    # What was written is whole shards of finished rows, and a rerun completes the job.
    first = output(tmp_path / "out")
    assert 0 < len(first) < 20000 and not list((tmp_path / "out").glob(".part-*"))
    run(config, factory(steps=1))
    ids = [r["id"] for r in output(tmp_path / "out")]
    assert len(ids) == len(set(ids)) == 20000
    assert len(RecordingEngine.instances[0].added) == 20000 - len(first)


def test_an_input_that_breaks_midway_stops_the_run_with_one_clear_error(tmp_path, tiny_model_dir):
    data = gzip.compress(b"".join(b'{"prompt": "p %d"}\n' % i for i in range(50000)))
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])  # truncated: the end cannot be decompressed
    with pytest.raises(UserError, match="cannot read input .*in.jsonl.gz"):
        run(make_config(tmp_path, tiny_model_dir, [path]), factory())


def test_an_engine_that_cannot_load_the_model_leaves_no_shards(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": ""}, {"prompt": "a"}])

    def broken(config):
        raise ValueError("unsupported architecture 'GPT2LMHeadModel'")

    with pytest.raises(UserError, match="cannot load model .*unsupported architecture"):
        run(make_config(tmp_path, tiny_model_dir, [path]), broken)
    assert not (tmp_path / "out").exists()


def test_the_engine_is_kept_busy_but_never_flooded(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p {i}"} for i in range(5000)])
    run(make_config(tmp_path, tiny_model_dir, [path], max_num_seqs=4), factory(steps=2))
    engine = RecordingEngine.instances[0]
    assert len(engine.added) == 5000
    # Requests are added in reader batches (1024 rows) while fewer than 2 x 4 are unfinished.
    assert engine.most_unfinished < 2 * 4 + 1024


def test_a_seed_gives_each_row_its_own_reproducible_seed(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "prompt": "same"} for i in range(6)])
    sampling = SamplingParams(temperature=0.8, seed=7)
    config = make_config(tmp_path, tiny_model_dir, [path], sampling=sampling)
    run(config, factory())
    first = {r: p.seed for r, (_, p) in RecordingEngine.instances[0].added.items()}
    assert len(set(first.values())) == 6
    run(make_config(tmp_path, tiny_model_dir, [path], sampling=sampling, overwrite=True), factory())
    assert {r: p.seed for r, (_, p) in RecordingEngine.instances[0].added.items()} == first


def test_stats_json_describes_the_job(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": p} for p in PROMPTS] + [{"prompt": None}])
    config = make_config(tmp_path, tiny_model_dir, [path], sampling=SamplingParams(max_tokens=5,
                         temperature=0.0))  # fmt: skip
    run(config, factory())
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["rows"] == 5 and stats["errors"] == 1
    assert stats["completion_tokens"] == 4 * 5  # every reversed prompt is cut at max_tokens
    assert stats["prompt_tokens"] > 0 and stats["wall_time_s"] > 0
    assert stats["generated_tokens_per_s"] > 0
    assert stats["model"] == str(tiny_model_dir)
    assert stats["sampling"]["max_tokens"] == 5 and stats["sampling"]["temperature"] == 0.0
    assert stats["bulkgen_version"]
    assert stats["engine"] == "fake"  # engine.stats joins in


def test_a_rerun_generates_only_the_missing_rows(tmp_path, tiny_model_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p {i}"} for i in range(100)])
    config = make_config(tmp_path, tiny_model_dir, [path], shard_size=10, format="jsonl")
    run(config, factory())
    (tmp_path / "out" / "part-00003.jsonl").unlink()
    stats = run(config, factory())
    assert len(RecordingEngine.instances[0].added) == 10
    ids = [r["id"] for r in output(tmp_path / "out")]
    assert sorted(ids) == sorted(f"in:{i}" for i in range(100))
    assert stats["rows"] == 100 and stats["this_run"]["rows"] == 10
