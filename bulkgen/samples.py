"""Rows to requests: each row's sampling parameters, and one copy of the row per sample (--n).

Sample k of a row gets its own seed from (seed, id, k), so a rerun samples the same text for it
whatever else runs beside it; sample 0's seed is the one a job without --n has always given.
Without --seed, the job's own seed (drawn once and recorded in job.json) takes its place.

On a rerun, complete shards already hold some (id, sample) pairs: a row whose samples are all
there is skipped; a row with only some of them generates the others.
"""

from __future__ import annotations

import dataclasses
import hashlib

from bulkgen.config import SamplingParams
from bulkgen.io.job import Done
from bulkgen.row import Row


def row_n(row: Row, n: int) -> int:
    """The number of samples a row asks for: its own `n` (OpenAI batch rows), else --n."""
    value = row.overrides.get("n") if row.overrides else None
    if value is None:
        return n
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"bad sampling parameter: 'n' must be a positive integer, got {value!r}")
    return value


class Samples:
    """Expands rows into their samples, each with its SamplingParams (or the row's error)."""

    def __init__(self, params: SamplingParams, n: int = 1, job_seed: int | None = None) -> None:
        self.n = n
        self.row_params = RowParams(params, job_seed)
        self._groups = 0

    def __call__(self, rows: list[Row]) -> list[Row]:
        out: list[Row] = []
        for row in rows:
            try:
                n = row_n(row, self.n)
            except ValueError as e:
                n = self.n
                if row.error is None:
                    row.fail(str(e))
            todo = [k for k in range(n) if not row.samples_done >> k & 1]
            self._groups += 1
            for k in todo:
                copy = row if k == todo[-1] else dataclasses.replace(row)
                copy.sample, copy.group, copy.group_size = k, self._groups, len(todo)
                if copy.error is None:
                    try:
                        copy.params = self.row_params(copy)
                    except ValueError as e:
                        copy.fail(str(e))
                out.append(copy)
        return out


class Resume:
    """Leaves out the rows whose samples are all in complete shards; marks the partly done."""

    def __init__(self, done: Done, n: int) -> None:
        self.done = done
        self.n = n

    def __call__(self, rows: list[Row]) -> list[Row]:
        if not self.done.ids:
            return rows
        keep = []
        for row in rows:
            mask = self.done.mask(row.id)
            if mask:
                try:
                    full = (1 << row_n(row, self.n)) - 1
                except ValueError:
                    full = 1  # its error record is sample 0
                if mask & full == full:
                    continue
                row.samples_done = mask
            keep.append(row)
        return keep


_INT_PARAMS = ("max_tokens", "top_k", "seed", "logprobs")
_FLOAT_PARAMS = ("temperature", "top_p", "min_p")
_FLOAT_PARAMS += ("repetition_penalty", "presence_penalty", "frequency_penalty")


def _checked_overrides(overrides: dict) -> dict:
    """Per-row parameter values with their types checked; ValueError names the bad column."""
    out = {}
    for name, value in overrides.items():
        if name == "n":  # the number of samples: see samples.py
            continue
        if name in _INT_PARAMS:
            ok = isinstance(value, int) and not isinstance(value, bool)
            if isinstance(value, float) and value.is_integer():
                ok, value = True, int(value)
            if not ok:
                raise ValueError(f"column {name!r} must be an integer, got {value!r}")
        elif name in _FLOAT_PARAMS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"column {name!r} must be a number, got {value!r}")
            value = float(value)
        elif name == "stop":
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError("column 'stop' must be a string or a list of strings")
            value = tuple(value)
        out[name] = value
    return out


class RowParams:
    """Sampling parameters per row: the job's, overridden by the row's own parameter columns.

    Each sampled row's seed comes from the job seed (--seed, else the job's recorded seed), the
    row's id and its sample index: a row samples the same text on a rerun, whatever its batch
    mates. A row's `seed` column is used as it is for sample 0 (and seeds the others).
    """

    def __init__(self, params: SamplingParams, job_seed: int | None = None) -> None:
        self.params = params
        self.seed = params.seed if params.seed is not None else job_seed

    def __call__(self, row: Row) -> SamplingParams:
        params = self.params
        if row.overrides:
            try:
                params = dataclasses.replace(params, **_checked_overrides(row.overrides))
            except ValueError as e:
                raise ValueError(f"bad sampling parameter: {e}") from None
            if row.overrides.get("seed") is not None:
                if row.sample == 0:
                    return params
                return dataclasses.replace(params, seed=derive_seed(params.seed, row.sample))
        if self.seed is None or params.greedy:
            return params
        parts = (self.seed, row.id) if row.sample == 0 else (self.seed, row.id, row.sample)
        return dataclasses.replace(params, seed=derive_seed(*parts))


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from its parts (the job seed, a row id, a sample index)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
