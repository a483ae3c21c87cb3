"""Repeated ids: the first occurrence is generated, each repeat is an error record of its own row,
on the first run and on every rerun alike (resume stays exactly once)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from bulkgen.engine.fake import FakeEngine
from bulkgen.io.inputs import find_sources
from bulkgen.io.reader import Reader
from bulkgen.pipeline import run
from bulkgen.run_config import RunConfig


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def output(out) -> list[dict]:
    return [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_a_repeated_id_is_an_error_record_naming_the_first_occurrence(tmp_path):
    path = tmp_path / "prompts.jsonl"
    records = [{"id": "x", "prompt": "a"}, {"id": "y", "prompt": "b"}, {"id": "x", "prompt": "c"},
               {"prompt": "d"}, {"id": "prompts:3", "prompt": "e"}]  # fmt: skip
    write_jsonl(path, records)
    reader = Reader(find_sources([str(path)]), "prompt", "id")
    rows = [row for batch in reader.batches() for row in batch]
    assert [(r.id, r.error) for r in rows] == [
        ("x", None),
        ("y", None),
        ("prompts:2", f"duplicate id 'x' (first at {path} row 0, line 1)"),
        ("prompts:3", None),
        ("prompts:4", f"duplicate id 'prompts:3' (first at {path} row 3, line 4)"),
    ]


def test_a_row_whose_id_a_record_took_says_so_and_a_bad_line_keeps_its_error(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}, {"id": "d:1", "prompt": "c"},
             {"id": "d:4", "prompt": "d"}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "not JSON\n")
    reader = Reader(find_sources([str(path)]), "prompt", "id")
    rows = [(r.id, r.error) for batch in reader.batches() for r in batch]
    assert rows[:2] == [("x", None), ("d:1", f"duplicate id 'x' (first at {path} row 0, line 1)")]
    assert rows[2] == (
        "d:2",
        f"id 'd:1' is the id of the error record written for the repeated id at {path} row 1, "
        "line 2: give this row another id",
    )
    assert rows[3] == ("d:4", None)
    assert rows[4][0] == "d:4~" and rows[4][1].startswith("row 4, line 5: not valid JSON")


def test_repeated_ids_resume_exactly_once(tmp_path, tiny_model_dir):
    """The issue's repro: 40 rows, 20 distinct ids, the last two shards deleted, a rerun."""
    path = tmp_path / "in.jsonl"
    write_jsonl(path, [{"id": f"id{i % 20}", "prompt": f"prompt {i}"} for i in range(40)])
    config = RunConfig(inputs=(str(path),), out=str(tmp_path / "out"), model=str(tiny_model_dir),
                       quiet=True, shard_size=5, max_num_seqs=4)  # fmt: skip
    run(config, lambda c: FakeEngine(c))
    first = output(tmp_path / "out")
    shards = sorted((tmp_path / "out").glob("part-*.parquet"))
    for shard in shards[-2:]:
        shard.unlink()
    stats = run(config, lambda c: FakeEngine(c))
    rows = output(tmp_path / "out")
    assert len(rows) == 40 and stats["rows"] == 40
    assert sorted((r["id"], r["error"]) for r in rows) == sorted(
        (r["id"], r["error"]) for r in first
    )
    generated = sorted(r["id"] for r in rows if r["error"] is None)
    duplicates = sorted(r["id"] for r in rows if r["error"] is not None)
    assert generated == sorted(f"id{i}" for i in range(20))
    assert duplicates == sorted(f"in:{i}" for i in range(20, 40))
    assert all(r["error"].startswith(f"duplicate id 'id{int(r['id'][3:]) - 20}' (first at ")
               for r in rows if r["error"])  # fmt: skip


def test_a_new_file_sorting_first_with_a_generated_id_comes_after_the_recorded_ones(
    tmp_path, tiny_model_dir
):
    """A folder job resumed after a file that sorts first, repeating a generated row's id, was
    added: the row generated stays the id's first (its record is kept), the new file's row is the
    duplicate's error record, and every input row appears once (before, the generated row was
    also written again as a duplicate of the new row, which itself was never written)."""
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "b.jsonl", [{"id": "x", "prompt": "from b"}, {"id": "y", "prompt": "b2"}])
    config = RunConfig(inputs=(str(folder),), out=str(tmp_path / "out"), model=str(tiny_model_dir),
                       quiet=True)  # fmt: skip
    run(config, lambda c: FakeEngine(c))
    write_jsonl(folder / "a.jsonl", [{"id": "x", "prompt": "from a"}, {"id": "z", "prompt": "a2"}])
    for _ in range(2):  # the rerun that meets the new file, then one with nothing left
        run(config, lambda c: FakeEngine(c))
        rows = {r["id"]: r for r in output(tmp_path / "out")}
        assert sorted(rows) == ["a:0", "x", "y", "z"]
        assert rows["x"]["prompt"] == "from b" and rows["x"]["error"] is None
        b_first = f"duplicate id 'x' (first at {folder / 'b.jsonl'} row 0, line 1)"
        assert (rows["a:0"]["prompt"], rows["a:0"]["error"]) == ("from a", b_first)
        assert rows["z"]["error"] is None


def test_a_repeated_ids_record_keeps_its_text_prompt(tmp_path):
    path = tmp_path / "d.jsonl"
    write_jsonl(path, [{"id": "a", "prompt": "first"}, {"id": "a", "prompt": "second"}])
    rows = [
        r for batch in Reader(find_sources([str(path)]), "prompt", "id").batches() for r in batch
    ]
    assert rows[1].error.startswith("duplicate id 'a'") and rows[1].prompt_text == "second"
