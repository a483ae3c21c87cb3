"""bulkgen score: answer extraction, normalisation, exact match, stats.json and baselines."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.errors import UserError
from bulkgen.score import extract_number, extract_phrase, is_correct, normalize, score_folder


@pytest.mark.parametrize(
    "text, number",
    [
        ("2 + 2 = 4", "4"),
        ("A spider has 8 legs.", "8"),
        ("The answer is 1,234.", "1234"),
        ("The answer to this question is 7. Earth has 12 plates", "7"),
        ("Answer: -3.50", "-3.5"),
        ("It boils at 100.0 degrees", "100"),
        ("eight legs", "8"),
        ("no number here", None),
    ],
)
def test_a_number_is_the_one_after_answer_is_else_the_last(text, number):
    assert extract_number(text) == number


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("Paris", "paris"),
        ("  \nThe answer is: Carbon Dioxide!\nBecause plants...", "carbon dioxide"),
        ("The Pacific Ocean. It is the largest.", "pacific ocean"),
        ("Answer: an apple", "apple"),
        ("H2O", "h2o"),
        ("Answer:\nParis", "paris"),  # the mark ends its line: the answer is on the next
        ("The final answer is:\n\n  The Nile.\nIt flows north.", "nile"),
        ("Answer:", ""),
    ],
)
def test_a_phrase_is_the_first_clause_normalised(text, phrase):
    assert extract_phrase(text) == phrase


def test_normalize_drops_case_punctuation_articles_and_spaces():
    assert normalize("  The  Great-Wall, of China! ") == "great wall of china"


def test_normalize_composes_unicode_so_equal_text_matches():
    """A decomposed accent (NFD, as macOS file names and some tokenizers give it) or full-width
    letters match the same text composed: they did not (a reference never matched)."""
    decomposed, composed = "Cafe\u0301 Mu\u0308ller", "Caf\u00e9 M\u00fcller"
    assert normalize(decomposed) == normalize(composed) == "caf\u00e9 m\u00fcller"
    assert is_correct(decomposed, composed) and is_correct(composed, decomposed)
    assert normalize("\uff30\uff41\uff52\uff49\uff53") == "paris"


@pytest.mark.parametrize(
    "text, reference, correct",
    [
        ("The capital of France is Paris.", "Paris", True),
        ("Paris is lovely. The capital is Lyon.", "Paris", False),
        ("Parisian food", "Paris", False),
        ("The largest ocean is the Pacific.", "Pacific Ocean|Pacific", True),
        ("12 * 12 = 120\n\nThe answer is 120.", "144", False),
        ("12 times 12 is 144", "144", True),
        ("1000 + 234 = 1,234", "1234", True),
        ("The answer is 4.0", "4", True),
        ("Leonardo da Vinci", ["Leonardo da Vinci", "da Vinci"], True),
        (None, "4", False),
        ("4", None, False),
        # A reference of several clauses takes as many of the text's (found by fuzzing: the
        # text's first clause alone, "Paris", never equalled "Paris, France").
        ("Paris, France", "Paris, France", True),
        ("Washington, D.C.", "Washington, D.C.", True),
        ("The city is St. Louis.", "St. Louis", True),
        ("Yes; definitely", "Yes; definitely", True),
        ("Paris, Texas", "Paris, France", False),
        ("Paris, France", "Paris", True),
    ],
)
def test_exact_match_after_extraction(text, reference, correct):
    assert is_correct(text, reference) is correct


def write_results(folder, rows, fmt="parquet", stats=None):
    folder.mkdir(parents=True, exist_ok=True)
    full = [{"finish_reason": "stop", "error": None, **r} for r in rows]
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(full), folder / "part-00000.parquet")
    else:
        (folder / "part-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full))
    if stats is not None:
        (folder / "stats.json").write_text(json.dumps(stats))
    return folder


ROWS = [
    {"id": "a", "text": "Paris.", "answer": "Paris"},
    {"id": "b", "text": "2 + 2 = 5", "answer": "4"},
    {"id": "c", "text": "Tokyo", "answer": "Tokyo"},
    {"id": "d", "text": "Mars", "answer": "Mars"},
]


def test_the_score_is_merged_into_stats_json(tmp_path):
    results = write_results(tmp_path / "r", ROWS, stats={"rows": 4, "wall_time_s": 1.5})
    section = score_folder(results)
    assert section["accuracy"] == 0.75 and section["n"] == 4 and section["correct"] == 3
    stats = json.loads((results / "stats.json").read_text())
    assert stats["rows"] == 4 and stats["wall_time_s"] == 1.5
    assert stats["score"] == section


def test_jsonl_shards_and_a_missing_stats_json(tmp_path):
    results = write_results(tmp_path / "r", ROWS, fmt="jsonl")
    assert score_folder(results)["correct"] == 3
    assert json.loads((results / "stats.json").read_text())["score"]["n"] == 4


def test_an_error_record_counts_as_wrong(tmp_path):
    rows = [{"id": "a", "text": "Paris", "answer": "Paris", "finish_reason": "error"}]
    assert score_folder(write_results(tmp_path / "r", rows))["correct"] == 0


def test_samples_are_scored_one_by_one(tmp_path):
    rows = [{"id": "a", "sample": s, "text": t, "answer": "4"} for s, t in enumerate(["4", "5"])]
    section = score_folder(write_results(tmp_path / "r", rows))
    assert (section["n"], section["correct"]) == (2, 1)


def test_the_baseline_diff_lists_the_ids_that_changed(tmp_path):
    before = [
        {"id": "a", "text": "Lyon", "answer": "Paris"},  # wrong, then right: fixed
        {"id": "b", "text": "4", "answer": "4"},  # right, then wrong: broken
        {"id": "c", "text": "Tokyo", "answer": "Tokyo"},  # right both times
        {"id": "old", "text": "x", "answer": "x"},
    ]
    baseline = write_results(tmp_path / "yesterday", before)
    results = write_results(tmp_path / "today", ROWS)
    section = score_folder(results, baseline=baseline)
    base = section["baseline"]
    assert base["fixed"] == ["a"] and base["broken"] == ["b"]
    assert base["new"] == ["d"] and base["gone"] == ["old"]
    assert base["accuracy"] == 0.75
    other = write_results(tmp_path / "other", [{"id": "z", "text": "x", "answer": "x"}])
    with pytest.raises(UserError, match="holds none of the ids"):  # it said 0 fixed, 0 broken
        score_folder(results, baseline=other)


def test_a_missing_reference_column_names_the_flags(tmp_path):
    results = write_results(tmp_path / "r", [{"id": "a", "text": "Paris"}])
    with pytest.raises(UserError, match="no column 'answer'.*--keep-columns answer"):
        score_folder(results)


def test_a_folder_without_shards_is_an_error(tmp_path):
    (tmp_path / "r").mkdir()
    with pytest.raises(UserError, match="holds no part-\\* shards"):
        score_folder(tmp_path / "r")


def test_the_score_command_prints_the_score_and_the_changes(tmp_path):
    baseline = write_results(tmp_path / "yesterday", [{"id": "b", "text": "4", "answer": "4"}])
    results = write_results(tmp_path / "today", ROWS)
    args = ["score", results, "--baseline", baseline, "--reference-column", "answer"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "accuracy 75.0% (3/4 correct, exact match on 'answer')"
    assert lines[1].endswith("(100.0%): 0 fixed, 1 broken")
    assert lines[2:] == ["broken: b"]


def test_the_score_command_reports_a_bad_folder_in_one_line(tmp_path):
    result = CliRunner().invoke(main, ["score", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: results folder {tmp_path / 'missing'} does not exist"


def test_the_score_command_takes_references_from_the_eval_set(tmp_path):
    """Results that did not keep the answer column are scored against the eval set by id."""
    results = write_results(tmp_path / "r", [{k: v for k, v in r.items() if k != "answer"}
                                             for r in ROWS])  # fmt: skip
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "eval.parquet")
    args = ["score", results, "--references", tmp_path / "eval.parquet"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "accuracy 75.0% (3/4 correct, exact match on 'answer')"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "label": "x"}]), tmp_path / "bad.parquet")
    bad = CliRunner().invoke(
        main, ["score", str(results), "--references", str(tmp_path / "bad.parquet")]
    )
    assert (
        bad.exit_code == 1
        and "need an 'id' (or 'custom_id') column and the 'answer' column" in bad.stderr
    )


@pytest.mark.parametrize(
    "text, reference, right",
    [
        ("A", "A", True),  # multiple choice: an article alone is the reference itself
        ("The answer is (A).", "A", True),
        ("B", "A", False),
        ("Pacific", '["Pacific Ocean", "Pacific"]', True),  # a JSONL list kept as JSON text
        ("The answer is 0.00001", 0.00001, True),  # a float column prints 1e-05
        ("The answer is 10000000000000000", 1e16, True),
        ("twenty-one", "1", False),  # a compound number word is no "one"
        ("The answer is one hundred.", "1", False),
        ("The answer is 1.5", ".5", False),  # ".5" is a number
        ("The answer is 0.5", ".5", True),
    ],
)
def test_references_that_were_scored_wrong(text, reference, right):
    assert is_correct(text, reference) is right


def test_jsonl_shards_with_line_separators_in_texts_are_read(tmp_path):
    """A JSONL line may hold U+2028 or U+0085 raw (the writer leaves non-ASCII as it is); the
    score read lines at them, and the folder could not be scored."""
    out = tmp_path / "r"
    out.mkdir()
    rows = [{"id": "a", "text": "Paris\u2028is it", "answer": "Paris"},
            {"id": "b", "text": "4\u0085", "answer": "4"}]  # fmt: skip
    (out / "part-00000.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    )
    assert score_folder(out)["correct"] == 2


def test_malformed_inputs_are_one_line_errors(tmp_path):
    results = write_results(tmp_path / "r", ROWS)
    for line in ("5", "null", '{"id": "a", "answer": "x"}\n[1]', '{"answer": "x"}'):
        (tmp_path / "refs.jsonl").write_text(line + "\n")
        with pytest.raises(UserError, match="need an 'id'"):
            score_folder(results, references=tmp_path / "refs.jsonl")
    (results / "stats.json").write_text("[1]")
    with pytest.raises(UserError, match="is damaged"):
        score_folder(results)
    (results / "stats.json").unlink()
    (tmp_path / "j").mkdir()
    for line in ("[1]", '{"text": "x"}'):
        (tmp_path / "j" / "part-00000.jsonl").write_text(line + "\n")
        with pytest.raises(UserError, match="cannot read shard"):
            score_folder(tmp_path / "j")


def test_a_baseline_of_another_n_is_named_so(tmp_path):
    one = write_results(tmp_path / "one", ROWS)
    rows = [{**r, "sample": s} for r in ROWS for s in range(2)]
    two = write_results(tmp_path / "two", rows)
    with pytest.raises(UserError, match="different --n"):
        score_folder(two, baseline=one)


def test_an_openai_line_of_a_failed_request_is_an_error_item(tmp_path):
    """OpenAI's own shape for a failed request (status 400, an error body) made the shard
    unreadable (KeyError 'choices')."""
    out = tmp_path / "r"
    out.mkdir()
    ok = {
        "custom_id": "a",
        "error": None,
        "response": {
            "status_code": 200,
            "body": {
                "choices": [{"index": 0, "message": {"content": "4"}, "finish_reason": "stop"}]
            },
        },
    }
    failed = {"custom_id": "b", "error": None, "response": {"status_code": 400, "body": {
        "error": {"message": "bad"}}}}  # fmt: skip
    (out / "part-00000.jsonl").write_text(json.dumps(ok) + "\n" + json.dumps(failed) + "\n")
    (tmp_path / "refs.jsonl").write_text(
        json.dumps({"custom_id": "a", "answer": "4"})
        + "\n"
        + json.dumps({"custom_id": "b", "answer": "4"})
        + "\n"
    )
    section = score_folder(out, references=tmp_path / "refs.jsonl")
    assert (section["n"], section["correct"]) == (2, 1)
