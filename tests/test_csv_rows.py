"""CSV and TSV rows read one at a time (io/csv_rows.py): on well-formed files, the rows and values
pyarrow's CSV reader gave before it (so default ids <file>:<row> and resumes keep their rows)."""

from __future__ import annotations

import csv
import io
import random

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from bulkgen.io.csv_rows import BadRow, csv_header, csv_records

PIECES = ["a", "b", " ", ",", "\t", '"', "\n", "\r\n", "é", "🙂", '""', "'", "\\"]


def random_text(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return ""
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))


def pyarrow_rows(path, delimiter: str, columns: list[str]) -> list[dict]:
    table = pacsv.read_csv(
        path,
        parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in columns}, strings_can_be_null=True
        ),
    )
    return table.to_pylist()


@pytest.mark.parametrize("suffix, delimiter", [(".csv", ","), (".tsv", "\t")])
def test_well_formed_files_read_as_pyarrow_read_them(tmp_path, suffix, delimiter):
    rng = random.Random(0)
    for trial in range(60):
        columns = ["id", "prompt", "note"][: rng.randint(2, 3)]
        rows = [[random_text(rng) for _ in columns] for _ in range(rng.randint(0, 20))]
        text = io.StringIO()
        writer = csv.writer(text, delimiter=delimiter, lineterminator=rng.choice(["\n", "\r\n"]))
        writer.writerow(columns)
        writer.writerows(rows)
        path = tmp_path / f"{trial}{suffix}"
        path.write_text(text.getvalue(), encoding="utf-8")
        assert csv_header(path) == columns
        ours = [record for record, _ in csv_records(path, columns)]
        assert ours == pyarrow_rows(path, delimiter, columns), text.getvalue()


def test_records_carry_the_line_they_start_on(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('prompt,n\n"a\nb",1\n\nc,2,3\nd,4\n')
    records = list(csv_records(path, ["prompt"]))
    assert [line for _, line in records] == [2, 5, 6]
    assert records[0][0] == {"prompt": "a\nb"} and records[2][0] == {"prompt": "d"}
    assert isinstance(records[1][0], BadRow)
