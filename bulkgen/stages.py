"""The loops of the pipeline's stages, one thread each, joined by bounded Channels.

Each loop ends by closing its output channel, so the end of the input travels down the line.
A failure anywhere sets the shared stop event instead, and every channel operation raises
Stopped (see channel.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from bulkgen.channel import EMPTY, Channel, Stopped
from bulkgen.guard import RowGuard
from bulkgen.io.reader import Reader
from bulkgen.io.writer import ShardWriter
from bulkgen.progress import Progress
from bulkgen.row import Row
from bulkgen.text.stop import StopWatcher

if TYPE_CHECKING:
    from bulkgen.engine.interface import GenerationEngine

_DETOK_BATCH_ROWS = 2048


def read(reader: Reader, keep: Callable[[list[Row]], list[Row]], out: Channel) -> None:
    """keep() leaves out the rows already done (see samples.Resume)."""
    for batch in reader.batches():
        if batch := keep(batch):
            out.put(batch)
    out.close()


def tokenize(
    fn: Callable[[list[Row]], None],
    expand: Callable[[list[Row]], list[Row]],
    inp: Channel,
    out: Channel,
    guard: RowGuard,
) -> None:
    """fn() tokenizes a batch in place; expand() makes its rows' samples (see samples.py)."""

    def both(rows: list[Row]) -> list[Row]:
        fn(rows)
        return expand(rows)

    while (batch := inp.get()) is not None:
        out.put(guard(both, batch))
    out.close()


def generate(
    engine: GenerationEngine, inp: Channel, out: Channel, bound: int, watcher: StopWatcher | None
) -> None:
    """The engine thread's loop: keep the engine fed and pass on what finishes.

    Requests are added while fewer than `bound` are unfinished (twice what the engine runs at
    once, so that its scheduler always has the next ones queued). With nothing in the engine,
    the loop blocks on its input; otherwise it only takes what is already there. Rows that
    failed before the engine go straight on. Requests with stop strings are watched by the
    watcher's thread; the ones it found a stop string in are aborted before the next step.
    """
    watch = watcher is not None
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
                request_id = str(next_id)  # input ids may repeat; the engine's must not
                next_id += 1
                in_engine[request_id] = row
                engine.add(request_id, row.prompt_ids, row.params)
                if watch and row.params.stop:
                    watcher.watch(request_id, row.params.stop)
            if failed:
                out.put(failed)
        if engine.num_unfinished == 0:
            if closed:
                break
            continue
        out.check()  # Ctrl-C or a failure elsewhere: stop now, not when a request finishes
        if watch:
            for request_id in watcher.take_aborts():
                engine.abort(request_id)
        finished = engine.step()
        if watch:
            watcher.send(engine.take_progress(), finished)
        if finished:
            out.put([_finish(in_engine.pop(o.request_id), o) for o in finished])
    if watcher is not None:
        watcher.close()
    out.close()


def _finish(row: Row, output) -> Row:
    if output.finish_reason == "error":
        row.fail(output.error or "the engine gave no reason")
    else:
        row.token_ids = output.token_ids
        row.finish_reason = output.finish_reason
        row.token_logprobs = output.token_logprobs
    return row


def detokenize(
    fn: Callable[[list[Row]], None], inp: Channel, out: Channel, guard: RowGuard
) -> None:
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
        out.put(guard(fn, rows))
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
