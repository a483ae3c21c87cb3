"""bulkgen score: exact-match accuracy of a results folder against a reference column.

An answer is extracted from each row's text and normalised before the comparison:
- a numeric reference ("42", "1,234", "2.50") takes the first number after an "answer is" or
  "answer:" mark, else the text's last number (or, with no digits, its last number word up to
  twenty; compounds are no number), compared as a number;
- any other reference takes the first clause (up to . ! ? ; or a comma) of the text's first
  non-empty line (of the part after an "answer is" mark, if it has one), lower-cased, without
  punctuation, articles (a, an, the; kept where they are the whole reference) or extra spaces
  (as many clauses as the reference has: "Paris, France" or "St. Louis" are two). A clause
  that ends with the reference on a word boundary also counts ("The capital of France is
  Paris." for "Paris"): small models answer in sentences.
A reference may list accepted alternatives, separated by "|" ("Pacific Ocean|Pacific") or as a
list. Error records count as wrong. With n samples per row, each (id, sample) pair is one item.
Shards written with --format openai are read too (one item per choice). References may also come
from another file keyed by id (`--references`): the eval set itself, when the results do not
keep its answer column (an OpenAI Batch output never does).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from bulkgen.errors import UserError
from bulkgen.io.job import STATS_FILE, write_json_atomic
from bulkgen.io.openai import is_openai_output
from bulkgen.score_match import extract_number, extract_phrase, is_correct, normalize

__all__ = ["extract_number", "extract_phrase", "is_correct", "normalize", "score_folder"]


@dataclass
class Score:
    correct: dict[str, bool] = field(default_factory=dict)  # item key -> correct

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def num_correct(self) -> int:
        return sum(self.correct.values())

    @property
    def accuracy(self) -> float:
        return self.num_correct / self.n if self.n else 0.0


def read_results(folder: str | Path) -> list[dict]:
    """Every row of a results folder's part-* shards (parquet or jsonl)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"results folder {folder} does not exist")
    shards = sorted(folder.glob("part-*.parquet")) + sorted(folder.glob("part-*.jsonl"))
    if not shards:
        raise UserError(f"{folder} holds no part-* shards: is it a bulkgen results folder?")
    rows: list[dict] = []
    samples = _job_samples(folder)
    for path in shards:
        try:
            if path.suffix == ".parquet":
                rows += pq.read_table(path).to_pylist()
            elif is_openai_output(path):
                rows += _openai_rows(path, samples)
            else:  # lines end at "\n" only: a text may hold U+2028, which splitlines breaks at
                rows += [json.loads(line) for line in _lines(path)]
            for row in rows:
                if not isinstance(row, dict) or "id" not in row:
                    raise ValueError(f"a line that is not a result row: {str(row)[:80]}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"cannot read shard {path}: {e!r}") from e
    return rows


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def _job_samples(folder: Path) -> int:
    """The job's --n, from its job.json (1 where it says none or there is none)."""
    try:
        return max(1, int(json.loads((folder / "job.json").read_text())["settings"].get("n", 1)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 1


def _openai_rows(path: Path, samples: int = 1) -> list[dict]:
    """A --format openai shard as result rows: one per choice (sample: its index, if several),
    its message's or completion's text; an error line an error record for each of the samples."""
    rows = []
    for line in _lines(path):
        record = json.loads(line)
        response = record.get("response") or {}  # a failed request (status 400) is an error
        body = response.get("body") if response.get("status_code", 200) == 200 else None
        if record.get("error") is not None or not body:
            error = {"id": record["custom_id"], "text": None, "finish_reason": "error"}
            rows += [{**error, "sample": k if samples > 1 else None} for k in range(samples)]
            continue
        choices = body["choices"]
        for choice in choices:
            message = choice.get("message")
            rows.append(
                {
                    "id": record["custom_id"],
                    "sample": choice.get("index") if len(choices) > 1 else None,
                    "text": message.get("content") if message else choice.get("text"),
                    "finish_reason": choice.get("finish_reason"),
                }
            )
    return rows


def read_references(path: str | Path, column: str) -> dict[str, object]:
    """id -> reference from a .jsonl(.gz) or .parquet file keyed by `id`, else `custom_id` (an
    OpenAI Batch input file)."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            records = pq.read_table(path).to_pylist()
        else:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the references {path}: {e}") from e
    if not records:
        raise UserError(f"the references {path} hold no rows")
    first = records[0] if isinstance(records[0], dict) else {}
    key = next((k for k in ("id", "custom_id") if k in first), None)
    whole = key is not None and all(isinstance(r, dict) and key in r for r in records)
    if not whole or not any(column in r for r in records):
        raise UserError(
            f"the references {path} need an 'id' (or 'custom_id') column and the {column!r} "
            "column, every row an object with its id"
        )
    return {str(r[key]): r.get(column) for r in records}


def with_references(rows: list[dict], references: dict, column: str, source: str) -> list[dict]:
    """The rows with their reference taken from `references` by id; an error if no id matches
    (the results and the references are not of the same set)."""
    if rows and not any(str(row["id"]) in references for row in rows):
        raise UserError(
            f"none of the ids in {source} is in the references (e.g. {rows[0]['id']!r}): "
            "are they of the same eval set?"
        )
    return [{**row, column: references.get(str(row["id"]))} for row in rows]


def score_rows(rows: list[dict], reference_column: str, source: str = "the results") -> Score:
    if rows and not any(reference_column in row for row in rows):
        raise UserError(
            f"{source} have no column {reference_column!r}; run with --keep-columns "
            f"{reference_column}, or name the right one with --reference-column"
        )
    score = Score()
    for row in rows:
        key = str(row["id"]) if row.get("sample") is None else f"{row['id']}#{row['sample']}"
        text = None if row.get("finish_reason") == "error" else row.get("text")
        score.correct[key] = is_correct(text, row.get(reference_column))
    return score


def score_folder(
    folder: str | Path,
    reference_column: str = "answer",
    baseline: str | Path | None = None,
    references: str | Path | None = None,
) -> dict:
    """Score a results folder, merge a `score` section into its stats.json, and return it.
    references: a file of id -> reference (read_references) for the results and the baseline."""
    refs = None if references is None else read_references(references, reference_column)

    def scored(path) -> Score:
        rows = read_results(path)
        if refs is not None:
            rows = with_references(rows, refs, reference_column, str(path))
        return score_rows(rows, reference_column, str(path))

    score = scored(folder)
    section: dict = {
        "accuracy": round(score.accuracy, 4),
        "n": score.n,
        "correct": score.num_correct,
        "reference_column": reference_column,
    }
    if baseline is not None:
        base = scored(baseline)
        sampled = {any("#" in key for key in s.correct) for s in (score, base) if s.correct}
        if len(sampled) > 1:  # items are (id, sample) pairs with --n, ids without
            raise UserError(
                f"the baseline {baseline} and {folder} were generated with different --n: "
                "compare runs of the same n"
            )
        both = sorted(key for key in score.correct if key in base.correct)
        if score.correct and base.correct and not both:  # as references of another set are
            raise UserError(f"the baseline {baseline} holds none of the ids of {folder}")
        section["baseline"] = {
            "path": str(baseline),
            "accuracy": round(base.accuracy, 4),
            "fixed": [k for k in both if score.correct[k] and not base.correct[k]],
            "broken": [k for k in both if base.correct[k] and not score.correct[k]],
            "new": sorted(set(score.correct) - set(base.correct)),
            "gone": sorted(set(base.correct) - set(score.correct)),
        }
    stats_path = Path(folder) / STATS_FILE
    stats = {}
    if stats_path.is_file():
        try:
            stats = json.loads(stats_path.read_text())
            if not isinstance(stats, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            raise UserError(f"{stats_path} is damaged ({e}); delete it to score again") from e
    write_json_atomic(stats_path, {**stats, "score": section})
    return section


def summary(section: dict) -> list[str]:
    """The lines `bulkgen score` prints: the score, then any changes against the baseline."""
    lines = [
        f"accuracy {section['accuracy']:.1%} ({section['correct']}/{section['n']} correct, "
        f"exact match on {section['reference_column']!r})"
    ]
    base = section.get("baseline")
    if base:
        lines.append(
            f"against {base['path']} ({base['accuracy']:.1%}): {len(base['fixed'])} fixed, "
            f"{len(base['broken'])} broken"
        )
        lines += [f"fixed: {key}" for key in base["fixed"]]
        lines += [f"broken: {key}" for key in base["broken"]]
    return lines
