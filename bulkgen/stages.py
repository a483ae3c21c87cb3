"""The loops of the pipeline's stages, one thread each, joined by bounded Channels.

Each loop ends by closing its output channel, so the end of the input travels down the line.
A failure anywhere sets the shared stop event instead, and every channel operation raises
Stopped (see channel.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from bulkgen.channel import EMPTY, Channel, Stopped
from bulkgen.config import SamplingParams
from bulkgen.io.reader import Reader
from bulkgen.io.writer import ShardWriter
from bulkgen.progress import Progress
from bulkgen.row import Row

_DETOK_BATCH_ROWS = 2048


def read(reader: Reader, skip: set[str], out: Channel) -> None:
    for batch in reader.batches(skip):
        out.put(batch)
    out.close()


def tokenize(fn: Callable[[list[Row]], None], inp: Channel, out: Channel) -> None:
    while (batch := inp.get()) is not None:
        fn(batch)
        out.put(batch)
    out.close()


def generate(engine, inp: Channel, out: Channel, params: RowParams, bound: int) -> None:
    """The engine thread's loop: keep the engine fed and pass on what finishes.

    Requests are added while fewer than `bound` are unfinished (twice what the engine runs at
    once, so that its scheduler always has the next ones queued). With nothing in the engine,
    the loop blocks on its input; otherwise it only takes what is already there. Rows that
    failed before the engine go straight on.
    """
    in_engine: dict[str, Row] = {}  # the engine's request id -> the row it came from
    next_id = 0
    closed = False
    while True:
        while not closed and engine.num_unfinished < bound:
            batch = inp.get(block=engine.num_unfinished == 0)
            if batch is EMPTY:
                break
            if batch is None:
                closed = True
                break
            failed = []
            for row in batch:
                if row.error is not None:
                    failed.append(row)
                    continue
                try:
                    row_params = params(row)
                except ValueError as e:
                    row.fail(str(e))
                    failed.append(row)
                    continue
                request_id = str(next_id)  # input ids may repeat; the engine's must not
                next_id += 1
                in_engine[request_id] = row
                engine.add(request_id, row.prompt_ids, row_params)
            if failed:
                out.put(failed)
        if engine.num_unfinished == 0:
            if closed:
                break
            continue
        finished = engine.step()
        if finished:
            out.put([_finish(in_engine.pop(o.request_id), o) for o in finished])
    out.close()


def _finish(row: Row, output) -> Row:
    if output.finish_reason == "error":
        row.fail(output.error or "the engine gave no reason")
    else:
        row.token_ids = output.token_ids
        row.finish_reason = output.finish_reason
    return row


def detokenize(fn: Callable[[list[Row]], None], inp: Channel, out: Channel) -> None:
    while (rows := inp.get()) is not None:
        # Gather what else is waiting: one large decode call beats many small ones.
        closed = False
        while len(rows) < _DETOK_BATCH_ROWS:
            more = inp.get(block=False)
            if more is EMPTY:
                break
            if more is None:
                closed = True
                break
            rows = rows + more
        fn(rows)
        out.put(rows)
        if closed:
            break
    out.close()


def write(writer: ShardWriter, progress: Progress, inp: Channel) -> None:
    try:
        while (rows := inp.get()) is not None:
            writer.add(rows)
            progress.add(rows)
    except Stopped:
        # Another stage failed or the run was interrupted. The buffered rows are complete
        # results: keep them, so that a rerun does not generate them again.
        writer.flush()
        raise
    writer.flush()


_INT_PARAMS = ("max_tokens", "top_k", "seed")
_FLOAT_PARAMS = ("temperature", "top_p", "min_p")


def _checked_overrides(overrides: dict) -> dict:
    """Per-row parameter values with their types checked; ValueError names the bad column."""
    out = {}
    for name, value in overrides.items():
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

    With a job seed, each row's own seed comes from it and the row's id: a row samples the same
    text on a rerun, whatever its batch mates. A row's `seed` column is used as it is.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = params

    def __call__(self, row: Row) -> SamplingParams:
        params = self.params
        if row.overrides:
            try:
                params = dataclasses.replace(params, **_checked_overrides(row.overrides))
            except ValueError as e:
                raise ValueError(f"bad sampling parameter: {e}") from None
            if "seed" in row.overrides:
                return params
        if self.params.seed is None or params.greedy:
            return params
        digest = hashlib.blake2b(f"{self.params.seed}:{row.id}".encode(), digest_size=8).digest()
        return dataclasses.replace(params, seed=int.from_bytes(digest, "little") >> 1)
