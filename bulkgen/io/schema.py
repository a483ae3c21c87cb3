"""The schema of kept columns (--keep-columns): one per job, so that all shards read as one dataset.

Fixed when the job starts: from the Parquet/Arrow schema of the inputs; CSV/TSV columns are text;
a JSONL column takes the type of the values in its first rows (100 parsable objects): all strings
-> string, all integers -> int64, integers and floats -> double, all booleans -> bool. Any other
mix (objects, lists, different kinds) -> string, each non-string value stored as its JSON text.
Inputs that disagree on a column's type also give a string column of JSON text. A rerun takes the
types from the job's existing Parquet shards. A later value that does not fit its column's type
(text in an int64 column) makes its row an error record naming the column.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from bulkgen.row import Row

_INT64 = 2**63
_JSON_TYPES = {str: pa.string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64()}


def json_type(values: list) -> pa.DataType:
    """The column type for the values of a JSONL column's first rows (see the module doc)."""
    kinds = {_JSON_TYPES.get(type(v)) for v in values if v is not None}
    if kinds == {pa.int64(), pa.float64()}:
        return pa.float64()
    if len(kinds) == 1 and None not in kinds:
        return kinds.pop()
    return pa.string()


def unified(types: list[pa.DataType | None]) -> pa.DataType:
    """One type for a column whose inputs give these (None: no value seen)."""
    known = {t for t in types if t is not None and t != pa.null()}
    return known.pop() if len(known) == 1 else pa.string()


def fit_kept(row: Row, types: dict[str, pa.DataType], trusted: frozenset = frozenset()) -> None:
    """Make the row's kept values fit the job's column types, or fail the row naming the column.

    trusted: columns read from an input column of the job's type, whose values fit already."""
    for name, value in row.extra.items():
        if value is None or name in trusted:
            continue
        kind = types.get(name, pa.string())
        fitted, ok = _fit(value, kind)
        row.extra[name] = fitted if ok else None
        if not ok and row.error is None:
            row.fail(
                f"column {name!r} holds {type(value).__name__} here, but the job stores it as "
                f"{kind} (from the first rows of its inputs; every shard has one schema)"
            )


def _fit(value: object, kind: pa.DataType) -> tuple[object, bool]:
    if kind == pa.string():
        if isinstance(value, str):
            return value, True
        return json.dumps(value, ensure_ascii=False, default=str), True
    if kind == pa.int64():
        ok = isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64
        return value, ok
    if kind == pa.float64():
        if isinstance(value, bool) or not isinstance(value, int | float):
            return value, False
        try:
            return float(value), True
        except OverflowError:  # an integer too large for a double
            return value, False
    if kind == pa.bool_():
        return value, isinstance(value, bool)
    try:  # a nested or special type from a Parquet input
        pa.array([value], kind)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return value, False
    return value, True


def kept_array(values: list, kind: pa.DataType | None) -> pa.Array:
    """A kept column's values as an array of the job's type. Some extension types do not take
    their own Python values back (bool8's bools, a permuted fixed_shape_tensor's lists): those
    are built as their storage, then wrapped."""
    try:
        return pa.array(values, kind)
    except Exception:
        if not isinstance(kind, pa.BaseExtensionType):
            raise
    storage = kind.storage_type
    try:
        array = pa.array(values, storage)
    except (pa.ArrowException, TypeError, ValueError):
        array = pa.array(values).cast(storage)
    return pa.ExtensionArray.from_storage(kind, array)


def parquet_unwritable(types: dict[str, pa.DataType]) -> list[str]:
    """The kept columns whose types a Parquet shard cannot hold (unions, month_day_nano
    intervals), each as "name (type: why)"."""
    bad = []
    for name, kind in types.items():
        try:
            pq.write_table(pa.table({name: kept_array([], kind)}), io.BytesIO())
        except (pa.ArrowException, NotImplementedError) as e:
            bad.append(f"{name} ({kind}: {e})")
    return bad
