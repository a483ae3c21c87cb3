"""Read rows from the sources in bounded batches: checked, deduplicated, limited.

Parquet, saved datasets and CSV/TSV stream through pyarrow record batches (io/tabular.py); JSONL
is parsed line by line (io/jsonl.py) so that one bad line becomes one error record. Every row is
checked where it is read (io/validate.py), so a bad value is its row's error record, and a row
whose id repeats an earlier one's is a duplicate's error record (io/seen.py). Memory stays flat
however large the input: one batch per source, plus an 8-byte hash per distinct id.

A file that breaks midway (a damaged .jsonl.gz) keeps the rows before the damage; the reader goes
on with the other inputs and records the damage in `damaged`, which the run reports at its end.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

import pyarrow as pa

from bulkgen.errors import UserError
from bulkgen.io.inputs import Source
from bulkgen.io.jsonl import (
    READ_ERRORS,
    Damaged,
    count_lines,
    is_batch_file,
    jsonl_fields,
    jsonl_types,
    read_jsonl,
)
from bulkgen.io.schema import unified
from bulkgen.io.seen import FirstSeen
from bulkgen.io.tabular import count_rows, read_table, table_schema
from bulkgen.row import PARAM_COLUMNS, Row
from bulkgen.structured import GrammarChecks

BATCH_ROWS = 1024
# The first batch is smaller, so that the engine starts on its first rows while the reader and
# the tokenizer convert, check and encode the rest of a full batch.
FIRST_BATCH_ROWS = 64
# Counting newlines costs a read of the file: do it only up to this size.
_COUNT_JSONL_BYTES = 4 << 30


DEFAULT_ID_COLUMN = "id"  # run_config.RunConfig's: a file without it numbers its rows


class Reader:
    def __init__(
        self,
        sources: list[Source],
        prompt_column: str,
        id_column: str,
        keep_columns: tuple[str, ...] = (),
        batch_rows: int = BATCH_ROWS,
        template_columns: tuple[str, ...] | None = None,
        messages_column: str = "messages",
        limit: int | None = None,
    ) -> None:
        self.sources = sources
        self.prompt_column = prompt_column
        self.id_column = id_column
        self.keep_columns = keep_columns
        self.batch_rows = batch_rows
        self.first_batch_rows = min(FIRST_BATCH_ROWS, batch_rows)
        # With --prompt-template: the columns it uses, put in Row.columns; the prompt column
        # is then optional.
        self.template_columns = template_columns
        # Rows whose prompt is missing or null and that have this column are conversations.
        self.messages_column = messages_column
        self.limit = limit  # --limit: read only the first rows of the inputs
        # The kept columns' types, fixed for the job before reading (see io/schema.py).
        self.keep_types: dict[str, pa.DataType] | None = None
        self.faults = 0  # rows whose reading raised (a bug), written as error records
        self.grammar_checks = GrammarChecks()  # rows' response_format, checked once per schema
        self.damaged: list[str] = []  # one line per input that broke midway

    def recorded_first(self, recorded: list[str]) -> None:
        """Read the files a resumed job recorded (job.json's input_files, in their order) before
        new ones: which of two rows sharing an id is the first, the one generated, must not
        change when a file that sorts before it is added to the inputs."""
        rank = {path: i for i, path in enumerate(recorded)}
        late = len(rank)
        order = {id(s): rank.get(str(s.paths[0].resolve()), late) for s in self.sources}
        self.sources.sort(key=lambda s: order[id(s)])  # stable: new files keep their order

    def check(self) -> None:
        """Open every source and check its columns, so a bad input fails before any work."""
        for source in self.sources:
            names = self._columns(source)
            if names is None:  # no rows to check (a JSONL file's unparsable rows become errors)
                continue
            if source.kind != "jsonl":
                self._check_unique(source, names)
            needed = [] if self.template_columns is not None else [self.prompt_column]
            if self.messages_column in names or self._is_batch_file(source):
                needed = []
            # An id column named on purpose must be there: where it is not, every row would take
            # a <file>:<row> id and a rerun's ids would not say which rows are done.
            if self.id_column != DEFAULT_ID_COLUMN and not self._is_batch_file(source):
                needed = [*needed, self.id_column]
            flags = {self.id_column: "--id-column"}
            for column, flag in [(c, flags.get(c, "--prompt-column")) for c in needed] + [
                (c, "--keep-columns") for c in self.keep_columns
            ]:
                if column not in names:
                    shown = ", ".join(sorted(names)[:20]) or "none"
                    raise UserError(
                        f"{source.label} has no column {column!r} (its columns: {shown}); "
                        f"name the right one with {flag}"
                    )

    def keep_schema(self) -> dict[str, pa.DataType]:
        """The kept columns' types from the inputs (the rule is in io/schema.py)."""
        found: dict[str, list] = {name: [] for name in self.keep_columns}
        for source in self.sources:
            if source.kind == "jsonl":
                types = _with_file_errors(
                    source, lambda s=source: jsonl_types(s.paths[0], self.keep_columns)
                )
            else:
                schema = _with_file_errors(source, lambda s=source: table_schema(s))
                types = {n: schema.field(n).type for n in self.keep_columns if n in schema.names}
            for name, kind in types.items():
                found[name].append(kind)
        return {name: unified(kinds) for name, kinds in found.items()}

    def has_batch_files(self) -> bool:
        """Whether any source is an OpenAI Batch input file (its rows may ask for n, logprobs)."""
        return any(self._is_batch_file(source) for source in self.sources)

    @staticmethod
    def _is_batch_file(source: Source) -> bool:
        return _with_file_errors(source, lambda: is_batch_file(source))

    def count(self) -> int | None:
        """Total rows in all sources (at most --limit) if cheap to know, else None."""
        total = 0
        for source in self.sources:
            n = _with_file_errors(source, lambda s=source: _count(s))
            if n is None:
                return None
            total += n
        return total if self.limit is None else min(total, self.limit)

    def batches(self, skip: Collection[str] = ()) -> Iterator[list[Row]]:
        """Lists of Rows (at most batch_rows each), leaving out rows whose id is in skip."""
        if self.keep_types is None:
            self.keep_types = self.keep_schema()
        seen = FirstSeen(self.sources)
        left = self.limit
        for number, source in enumerate(self.sources):
            if left == 0:
                return
            read = read_jsonl if source.kind == "jsonl" else read_table
            rows = read(self, source)
            while left != 0:
                try:
                    batch = next(rows, None)
                except Damaged as e:
                    self.damaged.append(
                        f"cannot read input {source.label} from row {e.index} on ({e}); the rows "
                        "before were read. Repair or replace the file and rerun to resume"
                    )
                    break
                except READ_ERRORS as e:
                    self.damaged.append(f"cannot read input {source.label}: {e}")
                    break
                if batch is None:
                    break
                if left is not None:
                    batch, left = batch[:left], left - min(left, len(batch))
                for row in batch:
                    seen.check(row, number)
                if skip:
                    batch = [row for row in batch if row.id not in skip]
                if batch:
                    yield batch

    def _check_unique(self, source: Source, names: list[str]) -> None:
        """A column the job reads must be named once in a table's header."""
        read = {self.prompt_column, self.id_column, self.messages_column, *self.keep_columns}
        read |= {*PARAM_COLUMNS, *(self.template_columns or ())}
        repeated = sorted({n for n in names if names.count(n) > 1} & read)
        if repeated:
            raise UserError(
                f"{source.label} names the column(s) {', '.join(map(repr, repeated))} more than "
                "once in its header; rename or drop the repeats"
            )

    def _columns(self, source: Source) -> Collection[str] | None:
        """The source's column names (a table's in header order, repeats kept); None for a source
        with no rows to check (a JSONL file with no parsable row, a CSV file with no header)."""
        if source.kind == "jsonl":
            return _with_file_errors(source, lambda: jsonl_fields(source.paths[0]))
        names = _with_file_errors(source, lambda: table_schema(source).names)
        return None if source.kind == "csv" and not names else names


def _with_file_errors(source: Source, fn: Callable):
    """fn(), with an unreadable file turned into one clear line."""
    try:
        return fn()
    except (OSError, EOFError, pa.ArrowException, UnicodeDecodeError) as e:
        raise UserError(f"cannot read input {source.label}: {e}") from e


def _count(source: Source) -> int | None:
    if source.kind != "jsonl":
        return count_rows(source)
    path = source.paths[0]
    if path.name.lower().endswith(".gz") or path.stat().st_size > _COUNT_JSONL_BYTES:
        return None
    return count_lines(path)
