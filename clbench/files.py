"""Writing output files (records, leaderboards, plots): atomically, and a failed write as one line that says what to
do.

:func:`write_atomic` writes a temporary file beside the target and renames it over the target, so a reader sees the
old file or the new one, never half of one; a temporary file is removed when the write fails (a full disk left
0-byte ``.tmp`` records behind). :func:`writing` turns an ``OSError`` raised while writing (``ENOSPC`` "No space
left on device", a read-only or vanished folder, a quota) into a :class:`~clbench.errors.OutputError` naming the
file: the command line prints it as one line and exits with code 2; records already written are intact.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from clbench.errors import OutputError


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Run the block that writes ``path``; an ``OSError`` in it becomes an :class:`OutputError`."""
    try:
        yield
    except OSError as exc:
        raise OutputError.of(path, exc) from exc


def write_atomic(path: str | Path, write: Callable[[Path], object] | str) -> Path:
    """Write ``path`` through a temporary file in the same folder (``write(tmp)``, or the text ``write``), then
    ``os.replace`` it over ``path``. On failure the temporary file is removed and an :class:`OutputError` raised."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with writing(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(write, str):
                tmp.write_text(write)
            else:
                write(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path


LOCK_FILE = ".clbench.lock"
"""The file in an output folder that the process writing there holds locked (:func:`locked_folder`): a suite
(``run``), :func:`clbench.api.run` with ``out``, ``leaderboard`` / ``report`` rebuilding its tables, ``analyze
paired`` reading its records or ``forget`` appending to it. It holds ``<pid> <what holds it>``."""


class FolderInUse(OutputError):
    """An output folder that another live process is writing to (it holds :data:`LOCK_FILE`)."""


@contextlib.contextmanager
def locked_folder(folder: str | Path, holder: str, then: str = "wait for it to end or pass another --out"
                  ) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (created) for the block: a second writer into the same folder is refused
    with :class:`FolderInUse` naming the folder, what holds it and its pid, and saying what to do (``then``), instead
    of both overwriting each other's records. ``holder``: what holds it, as the refusal names it (``the suite quick
    (run)``, ``leaderboard``...). The lock is ``flock`` on ``<folder>/.clbench.lock`` (which holds the pid and
    ``holder``): the kernel drops it when its process dies however it ends, so the lock of a dead process is simply
    taken over. A lock is per open file, so a second writer in the same process is refused too."""
    import fcntl

    path = Path(folder) / LOCK_FILE
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, what = os.pread(fd, 4096, 0).decode(errors="replace").strip().partition(" ")
            raise FolderInUse(f"output folder {folder} is in use by {what or 'another clbench process'} "
                              f"(pid {pid or '?'}); {then}.") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {holder}\n".encode(), 0)
        yield
    finally:
        os.close(fd)            # releases the lock; the file stays (removing it would race with a new holder)
