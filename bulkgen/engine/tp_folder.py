"""A tensor-parallel group's temporary folder (rank specs, logs, the rendezvous file), and the
removal of those a dead group left behind.

Rank 0 removes its group's folder when the group closes, and a rank whose rank 0 is gone removes
it before it ends. A signal that ends every process of the group at once (SIGTERM or SIGKILL to a
process group: a data-parallel worker's group stopped by its parent, a scheduler's timeout) leaves
nobody to do so, and /tmp filled with one folder a stopped job. So each folder names its owner
(rank 0's pid, in `owner`), and every new group first removes the folders whose owner is gone.
The owner file also names where that pid means something (host name and PID namespace): a group
in another container sharing /tmp cannot see its owner, and leaves its folder alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

PREFIX = "bulkgen-tp-"
OWNER = "owner"
# A folder without an owner file is young (rank 0 writes it right after creating the folder) or
# from before owner files: left alone for this long.
_UNOWNED_GRACE_S = 3600.0


def group_folder(parent: str | None = None) -> Path:
    """A new folder for this process's group, after removing those of dead groups in `parent`
    (the system's temporary folder by default)."""
    remove_stale(parent)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    (folder / OWNER).write_text(f"{os.getpid()}\n{_place()}")
    return folder


def remove_stale(parent: str | None = None) -> list[Path]:
    """Remove the group folders in `parent` whose owner process is gone (or that have no owner
    and are over an hour old); other users' folders and any it cannot read are left. Returns
    those removed."""
    removed = []
    try:
        candidates = list(Path(parent or tempfile.gettempdir()).glob(PREFIX + "*"))
    except OSError:
        return removed
    for folder in candidates:
        if _stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _stale(folder: Path) -> bool:
    try:
        if not folder.is_dir() or folder.stat().st_uid != os.getuid():
            return False
        owner = folder / OWNER
        if not owner.exists():
            return time.time() - folder.stat().st_mtime > _UNOWNED_GRACE_S
        pid, *place = owner.read_text().split("\n", 1)
        pid = int(pid)
    except (OSError, ValueError):
        return False
    if place and place[0] != _place():
        return False  # its pid is another host's or PID namespace's: alive for all we know
    return not _alive(pid)


def owner_pid(folder: Path) -> int:
    """The pid a group folder's owner file names."""
    return int((folder / OWNER).read_text().split("\n", 1)[0])


def _place() -> str:
    """Where this process's pids mean something: the host and the PID namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()} {namespace}"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid this module wrote: keep the folder
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process holds the pid
    return True
