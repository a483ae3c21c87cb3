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
from bulkgen.row import MAX_N, Row, checked_overrides


def row_n(row: Row, n: int) -> int:
    """The number of samples a row asks for: its own `n` (OpenAI batch rows), else --n."""
    value = row.overrides.get("n") if row.overrides else None
    if value is None:
        return n
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_N:
        raise ValueError(
            f"bad sampling parameter: 'n' must be an integer in [1, {MAX_N}], got {value!r}"
        )
    return value


def samples_left(row: Row, n: int) -> int:
    """How many samples of the row a run generates: those complete shards do not hold (a row
    whose n is bad is n error records, as Samples makes them)."""
    try:
        count = row_n(row, n)
    except ValueError:
        count = n
    return sum(1 for k in range(count) if not row.samples_done >> k & 1)


class Samples:
    """Expands rows into their samples, each with its SamplingParams (or the row's error)."""

    def __init__(
        self,
        params: SamplingParams,
        n: int = 1,
        job_seed: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.n = n
        self.row_params = RowParams(params, job_seed)
        self.vocab_size = vocab_size  # a row's logprobs may ask for at most this many
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
                        copy.params = self._checked(self.row_params(copy))
                    except ValueError as e:
                        copy.fail(str(e))
                out.append(copy)
        return out

    def _checked(self, params: SamplingParams) -> SamplingParams:
        if self.vocab_size is not None and (params.logprobs or 0) > self.vocab_size:
            raise ValueError(
                f"bad sampling parameter: logprobs {params.logprobs} is more than the model's "
                f"vocabulary ({self.vocab_size} tokens)"
            )
        return params


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
                params = dataclasses.replace(params, **checked_overrides(row.overrides))
            except ValueError as e:
                raise ValueError(f"bad sampling parameter: {e}") from None
            if row.overrides.get("seed") is not None:
                if row.sample == 0:
                    return params
                return dataclasses.replace(params, seed=sample_seed(params.seed, row.sample))
        if self.seed is None or params.greedy:
            return params
        if row.sample == 0:
            return dataclasses.replace(params, seed=derive_seed(self.seed, row.id))
        seed = derive_seed(self.seed, row.id, row.sample, domain=b"row sample")
        return dataclasses.replace(params, seed=seed)


def derive_seed(*parts: object, domain: bytes = b"") -> int:
    """A 63-bit seed from its parts (the job seed, a row id, a sample index). Each kind of parts
    hashes in its own domain: joined by ':', (seed, 'q', 1) and (seed, 'q:1') read alike, and ids
    often hold ':' (default ids are <file>:<row>). Sample 0's (seed, id) has the empty domain,
    the seed it had before domains."""
    text = ":".join(map(str, parts)).encode()
    digest = hashlib.blake2b(text, digest_size=8, person=domain).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_seed(seed: int, sample: int) -> int:
    """The seed of sample k > 0 of a request seeded as a whole (a row's seed column, LLM's
    SamplingParams.seed with n > 1)."""
    return derive_seed(seed, sample, domain=b"sample of seed")
