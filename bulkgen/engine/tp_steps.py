"""What stops a tensor-parallel step midway, as tp_group.RankGroup.stepping meets it: Ctrl-C,
deferred to the step's end where it can be, and a collective's own failure (a rank stuck, every
rank alive). Rank 0 leaving a step half done leaves the other ranks inside its collectives,
which the next step would meet out of order: gloo aborts the process on the size mismatch,
NCCL hangs."""

from __future__ import annotations

import contextlib
import signal
import threading

import torch


def is_collective_error(e: BaseException) -> bool:
    """A torch.distributed collective's own failure (gloo's timeout, a closed peer, NCCL's)."""
    dist_error = getattr(torch.distributed, "DistError", ())
    return isinstance(e, dist_error) or "gloo" in str(e) or "NCCL" in str(e)


@contextlib.contextmanager
def interrupts_deferred(hit: list):
    """A first Ctrl-C during the step is noted in `hit` and left for the caller to raise once
    the step has ended (every rank then waits at the same place, and the engine stays usable: an
    LLM's generate ends its requests and the next call runs); a second one raises at once (a
    step that does not end: the caller stops the ranks). Only where Python's own SIGINT handler
    is on (LLM in a script or a notebook, on the main thread); bulkgen run has a handler of its
    own, and other threads get no signals."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def note(signum, frame) -> None:
        if hit:
            raise KeyboardInterrupt
        hit.append(True)

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
