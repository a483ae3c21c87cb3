"""How the bulkgen process ends: exit statuses, SIGTERM, and no C++ abort on the way out.

    0 done    1 a user error (one line)    130 after SIGINT (Ctrl-C)    143 after SIGTERM

SIGTERM is turned into Terminated, a KeyboardInterrupt, so that it takes Ctrl-C's path: every
stage stops, the writer flushes its finished rows as a last shard, then the process exits.

Why the exit needs care: a daemon thread still running when the interpreter finalizes is ended
by pthread_exit as soon as it next takes the GIL. If its stack is then inside C++ (torch freeing
tensors, a forward pass), the forced unwind crosses a noexcept frame and libstdc++ aborts:
"terminate called without an active exception", status 134. It happened: the progress bar's
refresh thread, ending late, dropped the last reference to the pipeline and freed the engine's
tensors while the interpreter finalized. The pipeline therefore joins every thread it starts and
frees the engine on the engine's own thread. exit_process() is the last resort for a thread that
outlived its join timeout (an engine stuck in a long step): it flushes the standard streams and
ends the process with os._exit, which runs no finalization for that thread to crash in. Only the
CLI process does this; library callers get an exception, never an exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

SIGINT_STATUS = 128 + signal.SIGINT  # 130
SIGTERM_STATUS = 128 + signal.SIGTERM  # 143
_GRACE_S = 2.0  # for threads that were told to stop and are returning


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (a scheduler cancelling the job): handled as Ctrl-C, exit status 143."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_interrupts():
    """While inside, SIGTERM raises Terminated in the main thread (enter it from there)."""
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def interrupt_status(error: KeyboardInterrupt) -> int:
    return SIGTERM_STATUS if isinstance(error, Terminated) else SIGINT_STATUS


def exit_process(status: int) -> None:
    """End the process with this status; os._exit if a thread is still alive (see above)."""
    deadline = time.monotonic() + _GRACE_S
    while _other_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not _other_threads():
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _other_threads() -> list[threading.Thread]:
    """bulkgen's own threads still alive (others' are not ours to judge: a test runner's)."""
    return [t for t in threading.enumerate() if t.name.startswith("bulkgen-") and t.is_alive()]
