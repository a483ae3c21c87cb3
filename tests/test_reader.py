"""The reader: formats, stable ids, bad rows, missing columns, unreadable files, resume skips."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkgen.errors import UserError
from bulkgen.io.inputs import find_sources
from bulkgen.io.reader import Reader


def write_jsonl(path, records, raw_lines=()):
    lines = [json.dumps(r) for r in records] + list(raw_lines)
    data = ("\n".join(lines) + "\n").encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def read_all(*inputs, keep=(), skip=(), batch_rows=1024, prompt="prompt", id_column="id"):
    reader = Reader(find_sources([str(i) for i in inputs]), prompt, id_column, keep, batch_rows)
    reader.check()
    return [row for batch in reader.batches(set(skip)) for row in batch]


def test_jsonl_rows_get_their_id_or_file_stem_and_row_number(tmp_path):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "a"}, {"id": 7, "prompt": "b"}])
    rows = read_all(path)
    assert [(r.id, r.prompt) for r in rows] == [("prompts:0", "a"), ("7", "b")]


def test_blank_lines_are_not_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')
    assert [r.id for r in read_all(path)] == ["p:0", "p:1"]
    assert Reader(find_sources([str(path)]), "prompt", "id").count() == 2


def test_gzipped_jsonl_reads_like_plain(tmp_path):
    records = [{"prompt": f"q{i}"} for i in range(5)]
    plain = read_all(write_jsonl(tmp_path / "a.jsonl", records))
    zipped = read_all(write_jsonl(tmp_path / "gz" / "a.jsonl.gz", records))
    assert [(r.id, r.prompt) for r in plain] == [(r.id, r.prompt) for r in zipped]


def test_bad_jsonl_lines_become_error_rows_naming_the_line(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"prompt": "ok"}],
        raw_lines=["{not json", "[1, 2]", '{"text": "no prompt field"}', '{"prompt": "fine"}'],
    )
    rows = read_all(path)
    assert [r.error for r in rows] == [
        None,
        "row 1, line 2: not valid JSON: Expecting property name enclosed in double quotes",
        "row 2, line 3: a JSON array, not an object",
        "row 3, line 4: no 'prompt' field",
        None,
    ]
    assert [r.id for r in rows] == [f"p:{i}" for i in range(5)]
    assert all(r.finish_reason == "error" for r in rows if r.error)


def test_parquet_streams_in_batches_with_row_count_from_metadata(tmp_path):
    path = tmp_path / "data.parquet"
    table = pa.table({"prompt": [f"p{i}" for i in range(2500)], "x": list(range(2500))})
    pq.write_table(table, path, row_group_size=1000)
    reader = Reader(find_sources([str(path)]), "prompt", "id", ("x",), batch_rows=512)
    reader.check()
    assert reader.count() == 2500
    batches = list(reader.batches())
    assert max(len(b) for b in batches) <= 512
    rows = [r for b in batches for r in b]
    assert [r.id for r in rows] == [f"data:{i}" for i in range(2500)]
    assert rows[1234].prompt == "p1234" and rows[1234].extra == {"x": 1234}


def test_parquet_id_column_values_become_strings(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [10, None], "prompt": ["a", "b"]}), path)
    assert [r.id for r in read_all(path)] == ["10", "d:1"]


def test_token_id_lists_pass_through_as_prompts(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": [[1, 2, 3], [4]]}), path)
    assert [r.prompt for r in read_all(path)] == [[1, 2, 3], [4]]


def test_folder_and_glob_name_rows_by_path_below_them(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"prompt": "a"}])
    (tmp_path / "in" / "sub").mkdir()
    pq.write_table(pa.table({"prompt": ["b"]}), tmp_path / "in" / "sub" / "b.parquet")
    (tmp_path / "in" / "notes.txt").write_text("ignored")
    assert [r.id for r in read_all(tmp_path / "in")] == ["a:0", "sub/b:0"]
    assert [r.id for r in read_all(f"{tmp_path}/in/*/*.parquet")] == ["sub/b:0"]
    # The same file named twice is read once.
    assert len(read_all(tmp_path / "in" / "a.jsonl", tmp_path / "in")) == 2


def test_two_files_that_would_share_ids_are_refused(tmp_path):
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        write_jsonl(tmp_path / d / "p.jsonl", [{"prompt": "a"}])
    with pytest.raises(UserError, match="would both give rows ids 'p:<row>'"):
        find_sources([str(tmp_path / "x" / "p.jsonl"), str(tmp_path / "y" / "p.jsonl")])


def test_saved_dataset_reads_without_the_datasets_library(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"prompt": ["a", "b", "c"], "topic": ["x", "y", "z"]})
    ds.save_to_disk(str(tmp_path / "ds"))
    rows = read_all(tmp_path / "ds", keep=("topic",))
    assert [(r.id, r.prompt, r.extra["topic"]) for r in rows] == [
        ("ds:0", "a", "x"),
        ("ds:1", "b", "y"),
        ("ds:2", "c", "z"),
    ]
    splits = datasets.DatasetDict({"train": ds, "test": ds.select([2])})
    splits.save_to_disk(str(tmp_path / "dd"))
    assert [r.id for r in read_all(tmp_path / "dd")] == [
        "dd/train:0",
        "dd/train:1",
        "dd/train:2",
        "dd/test:0",
    ]
    assert [r.prompt for r in read_all(tmp_path / "dd" / "test")] == ["c"]  # one split alone


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_missing_prompt_column_is_one_clear_error(tmp_path, kind):
    path = tmp_path / f"d.{kind}"
    if kind == "jsonl":
        write_jsonl(path, [{"text": "a"}, {"text": "b"}])
    else:
        pq.write_table(pa.table({"text": ["a"]}), path)
    with pytest.raises(UserError, match=r"d\.\w+ has no column 'prompt' \(its columns: text\)"):
        read_all(path)


def test_a_missing_keep_column_is_one_clear_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    with pytest.raises(UserError, match="no column 'topic'.*--keep-columns"):
        read_all(path, keep=("topic",))


@pytest.mark.parametrize(
    "name,content", [("bad.parquet", b"not parquet"), ("bad.jsonl.gz", b"nogz")]
)
def test_an_unreadable_file_is_one_clear_error(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError, match=f"cannot read input .*{name}"):
        read_all(tmp_path / name)


def test_missing_inputs_are_refused(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        find_sources([str(tmp_path / "nope.jsonl")])
    with pytest.raises(UserError, match="no files match"):
        find_sources([str(tmp_path / "*.jsonl")])
    (tmp_path / "x.xlsx").write_text("a,b")
    with pytest.raises(UserError, match="unknown format"):
        find_sources([str(tmp_path / "x.xlsx")])


def test_rows_already_done_are_skipped(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": str(i)} for i in range(10)])
    rows = read_all(path, skip={"p:1", "p:5", "p:9"}, batch_rows=3)
    assert [r.id for r in rows] == ["p:0", "p:2", "p:3", "p:4", "p:6", "p:7", "p:8"]


def test_the_output_folder_is_never_read_as_input(tmp_path):
    write_jsonl(tmp_path / "data" / "p.jsonl", [{"prompt": "a"}])
    (tmp_path / "data" / "out").mkdir()
    pq.write_table(pa.table({"prompt": ["old"]}), tmp_path / "data" / "out" / "part-00000.parquet")
    sources = find_sources([str(tmp_path / "data")], exclude=tmp_path / "data" / "out")
    assert [s.name for s in sources] == ["p"]
    # A file named as it is, in the output folder (run p.jsonl -o .), is read; a shard is not.
    here = tmp_path / "data"
    named = find_sources([str(here / "p.jsonl"), str(here / "out")], exclude=here)
    assert [s.name for s in named] == ["p"]
    with pytest.raises(UserError, match="nothing but the output folder"):
        find_sources([str(here / "out" / "part-00000.parquet")], exclude=here)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_an_id_column_named_but_missing_is_one_clear_error(tmp_path, kind):
    """--id-column named on purpose and not in a file: its rows would have taken <file>:<row>
    ids silently (a typo made every rerun's ids other rows' than the user meant)."""
    path = tmp_path / f"d.{kind}"
    if kind == "jsonl":
        write_jsonl(path, [{"prompt": "a", "uid": 1}])
    else:
        pq.write_table(pa.table({"prompt": ["a"], "uid": [1]}), path)
    with pytest.raises(UserError, match=r"d\.\w+ has no column 'key' .*--id-column"):
        read_all(path, id_column="key")
    assert [r.id for r in read_all(path, id_column="uid")] == ["1"]
    assert [r.id for r in read_all(path)] == ["d:0"]  # the default id column may be absent
