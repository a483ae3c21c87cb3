"""CSV and TSV inputs as a user of `bulkgen run` meets them: values as text, bad rows as error
records, empty and header-only files."""

from __future__ import annotations

import gzip
import json

import pytest
from test_job_inputs import bulkgen, fake_engine, output  # noqa: F401 (fake_engine: a fixture)


@pytest.mark.parametrize("name, sep", [("in.csv", ","), ("in.tsv", "\t")])
def test_csv_and_tsv_inputs_read_like_jsonl(tmp_path, tiny_model_dir, name, sep):
    path, out = tmp_path / name, tmp_path / "out"
    lines = [sep.join(["id", "prompt", "topic", "max_tokens"]),
             sep.join(["a", '"Hello, there"' if sep == "," else "Hello, there", "7", "3"]),
             sep.join(["b", '"two\nlines"' if sep == "," else "two lines", "x", "abc"]),
             sep.join(["c", "", "", ""])]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "-q", "--keep-columns", "topic")
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in output(out)}
    assert rows["a"]["prompt"] == "Hello, there" and rows["a"]["error"] is None
    assert rows["a"]["topic"] == "7"  # CSV values are text
    assert (
        rows["b"]["error"]
        == "bad sampling parameter: column 'max_tokens' must be an integer, got 'abc'"
    )
    assert rows["b"]["prompt"] == ("two\nlines" if sep == "," else "two lines")  # kept in errors
    assert rows["c"]["error"] == "prompt is null"


def test_invalid_utf8_in_a_csv_value_is_that_rows_error_record(tmp_path, tiny_model_dir):
    path, out = tmp_path / "in.csv", tmp_path / "out"
    path.write_bytes(b"id,prompt,topic\na,Hello \xff\xfe there,t\nb,fine,\xc3\nc,also fine,x\n")
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "-q", "--keep-columns", "topic")
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in output(out)}
    assert rows["a"]["error"] == "column 'prompt' cannot be read (not valid UTF-8)"
    assert rows["b"]["error"] == "column 'topic' cannot be read (not valid UTF-8)"
    assert (rows["c"]["prompt"], rows["c"]["topic"], rows["c"]["error"]) == ("also fine", "x", None)


def test_an_empty_csv_has_no_rows_like_an_empty_jsonl(tmp_path, tiny_model_dir):
    (tmp_path / "empty.csv").write_bytes(b"")
    result = bulkgen("run", tmp_path / "empty.csv", "-m", tiny_model_dir, "-o", tmp_path / "a")
    assert result.exit_code == 0
    assert "nothing to generate: the input has no rows" in result.stderr
    (tmp_path / "b.tsv").write_text("prompt\nhi\n")
    both = [tmp_path / "empty.csv", tmp_path / "b.tsv"]
    assert bulkgen("run", *both, "-m", tiny_model_dir, "-o", tmp_path / "c", "-q").exit_code == 0
    assert [r["prompt"] for r in output(tmp_path / "c")] == ["hi"]


def test_an_empty_csv_beside_a_good_one_with_kept_columns(tmp_path, tiny_model_dir):
    """A CSV with no header (empty, or blank lines, gzipped too) has no columns to keep: it was a
    KeyError traceback with --keep-columns."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_bytes(b"")
    (folder / "b.csv.gz").write_bytes(gzip.compress(b"\n\n"))
    (folder / "c.csv").write_text("prompt,k\nhi,1\n")
    result = bulkgen("run", folder, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q",
                     "--keep-columns", "k")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [(r["prompt"], r["k"]) for r in output(tmp_path / "out")] == [("hi", "1")]


def test_csv_parameter_columns_kept_or_templated_stay_text(tmp_path, tiny_model_dir):
    """A CSV column named as a row parameter is parsed as a number for sampling only: kept or
    rendered by a template it is the file's text (it was the parsed number, and in Parquet
    shards each such row became a write error record)."""
    path = tmp_path / "in.csv"
    path.write_text("id,prompt,temperature,seed,max_tokens\n1,hi,0.70,007,0004\n2,yo,1e-1,1e3, 3\n")
    kept = ("--keep-columns", "temperature,seed,max_tokens")
    for fmt in ("parquet", "jsonl"):
        out = tmp_path / fmt
        result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "-q", "--format", fmt, *kept)
        assert result.exit_code == 0, result.output
        if fmt == "parquet":
            rows = output(out)
        else:
            rows = [json.loads(line) for p in sorted(out.glob("part-*")) for line in open(p)]
        got = {r["id"]: (r["temperature"], r["seed"], r["max_tokens"], r["error"]) for r in rows}
        assert got == {"1": ("0.70", "007", "0004", None), "2": ("1e-1", "1e3", " 3", None)}
    out = tmp_path / "template"
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "-q",
                     "--prompt-template", "T={{ temperature }}")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(r["prompt"] for r in output(out)) == ["T=0.70", "T=1e-1"]


def test_a_ragged_csv_row_or_an_unbalanced_quote_is_that_rows_error_record(
    tmp_path, tiny_model_dir
):
    """The rows around them are read as usual, at their own row numbers (their default ids)."""
    path, out = tmp_path / "in.tsv", tmp_path / "out"
    lines = ["prompt\tnote", "one\tx", "two\tx\textra", "three", "", '"Hello" she said\tx',
             '"unbalanced\tx', "swallowed\tx", 'closed" here\tx', "last\tx"]  # fmt: skip
    path.write_text("\r\n".join(lines) + "\r\n")
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "-q", "--keep-columns", "note")
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in output(out)}
    assert sorted(rows) == [f"in:{i}" for i in range(6)]
    assert (rows["in:0"]["prompt"], rows["in:0"]["note"], rows["in:0"]["error"]) == (
        "one",
        "x",
        None,
    )
    assert rows["in:1"]["error"] == "row 1: line 3 has 3 fields where the header has 2"
    assert rows["in:2"]["error"] == "row 2: line 4 has 1 fields where the header has 2"
    assert rows["in:3"]["prompt"] == "Hello she said"  # a bad quote on one line: read leniently
    assert rows["in:4"]["error"].startswith(
        "row 4: an unbalanced quote: the value opened on line 7 runs on to line 9 ("
    )
    assert "lines 8-9 are read as part of it, not as rows" in rows["in:4"]["error"]
    assert (rows["in:5"]["prompt"], rows["in:5"]["error"]) == ("last", None)


def test_csv_values_may_be_longer_than_the_csv_modules_default_limit(tmp_path, tiny_model_dir):
    path, out = tmp_path / "in.csv.gz", tmp_path / "out"
    long = "word " * 40_000  # 200 KB
    with gzip.open(path, "wt", encoding="utf-8-sig") as f:  # a byte order mark too
        f.write(f'id,prompt\nlong,"{long}"\nshort,hi\n')
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "-q")
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in output(out)}
    assert rows["long"]["prompt"] == long  # (too long for the tiny model: its own error)
    assert rows["short"]["prompt"] == "hi"


def test_a_finished_or_header_only_csv_job_has_nothing_to_generate(tmp_path, tiny_model_dir):
    """Small CSV files are counted (parsed), so the model is not loaded to find no work."""
    (tmp_path / "header.csv").write_text("id,prompt\n")
    result = bulkgen("run", tmp_path / "header.csv", "-m", tiny_model_dir, "-o", tmp_path / "a")
    assert "nothing to generate: the input has no rows" in result.stderr
    path = tmp_path / "in.csv"
    path.write_text('id,prompt\na,"two\nlines"\n\nb,x\n')  # 2 rows: a quoted newline, a blank line
    args = [path, "-m", tiny_model_dir, "-o", tmp_path / "b"]
    assert bulkgen("run", *args, "-q").exit_code == 0
    result = bulkgen("run", *args)
    assert result.exit_code == 0
    assert "nothing to generate: all 2 input rows are in complete shards already" in result.stderr
