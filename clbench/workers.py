"""A pool of worker processes, each running one job at a time, that knows which job a dead worker had.

:class:`concurrent.futures.ProcessPoolExecutor` cannot say which item a worker was running when it died (a kill, the
OOM killer, a segfault): the whole pool breaks. The local executor's ``--jobs N`` needs exactly that, to record that
run as failed (or run it again) while the others go on, so it uses this pool::

    with WorkerPool(2, setup, (threads, modules), start_method=start_method(threads, accelerator=False)) as pool:
        for item, outcome in pool.imap_unordered(fn, items, retries=1):
            ...   # outcome: fn(item)'s return value, or a WorkerLost after 1 + retries lost attempts

- Workers are started with ``start_method`` (``spawn`` by default; :func:`start_method` says when ``fork`` is safe),
  call ``setup(*setup_args)`` once, then run ``fn(item)`` for each item sent to them. They are not daemons, so a job
  may start processes of its own (the shard-member pool of ``--shard-workers``), and they ignore SIGINT: Ctrl-C
  reaches the parent, which stops them. They die with the parent (:func:`die_with_parent`: the kernel's
  parent-death signal on Linux, a watchdog on the parent's pid elsewhere): a driver killed with SIGKILL leaves no
  worker holding its memory behind.
- An exception raised by ``fn`` is re-raised in the parent (``fn`` should return failures as values; an exception
  is a set-up error that every item would repeat, such as a missing dataset). A worker that exits during a job is
  replaced; its job runs again up to ``retries`` times, then yields :class:`WorkerLost`.
- Leaving the ``with`` block (normally, by an exception or by Ctrl-C) kills the workers that are still running:
  jobs not yet finished are lost, finished ones were already yielded.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any


def start_method(threads: int | None, accelerator: bool) -> str:
    """How to start workers that each run ``threads`` torch threads: ``fork`` on Linux for CPU work with one thread
    per worker, ``spawn`` otherwise.

    A forked worker is ready in milliseconds with the parent's modules imported; a spawned one imports torch,
    Avalanche and continuum again (about 10 s of CPU per worker on the 2-core development machine, which made
    ``--jobs 2`` slower than ``--jobs 1`` on an 8-run suite of 2-second runs; docs/scale_out.md). Fork is refused
    where it is unsafe: more than one (or an unset number of) torch threads per worker (GNU OpenMP's thread pool,
    once used by the parent, hangs a forked child's first parallel region: seen here with torch 2.14.1, while a
    one-thread child never enters it), workers that run on an ``accelerator`` or a parent that has initialized CUDA
    (a CUDA context does not survive fork), and other systems than Linux (macOS system libraries are not
    fork-safe)."""
    torch = sys.modules.get("torch")                   # not imported: CUDA cannot be in use here
    cuda_here = torch is not None and torch.cuda.is_initialized()
    return "fork" if sys.platform == "linux" and threads == 1 and not (accelerator or cuda_here) else "spawn"


@dataclass(frozen=True)
class WorkerLost:
    """A job whose worker process exited before answering, ``attempts`` times; ``exitcode`` of the last one
    (negative: killed by that signal)."""

    exitcode: int | None
    attempts: int

    @property
    def reason(self) -> str:
        how = (f"killed by signal {signal.Signals(-self.exitcode).name}"
               if self.exitcode is not None and self.exitcode < 0 else f"exit code {self.exitcode}")
        return (f"WorkerLost: the worker process running this job died ({how}), {self.attempts} time(s) "
                f"(retries: {self.attempts - 1}); out of memory is a common cause")


PR_SET_PDEATHSIG = 1          # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Make this process exit when process ``parent`` (the one that started it) does, however it ends (SIGKILL
    included): on Linux the kernel sends SIGKILL (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon thread checks
    every second whether this process was re-parented. Exits at once if ``parent`` is already gone."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            _watch(parent)
    else:
        _watch(parent)
    if os.getppid() != parent:              # it died before the signal was armed
        os._exit(1)


def _watch(parent: int) -> None:
    def watchdog() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watchdog, name="parent-watchdog", daemon=True).start()


def _main(conn: Connection, setup: Callable[..., None], setup_args: tuple, parent: int) -> None:
    """A worker's life: set up once, then answer ``(fn, item)`` with ``("ok", result)`` or ``("error", exc)``."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)     # the driver's SIGTERM handler is not the worker's
    setup(*setup_args)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        fn, item = message
        try:
            answer = ("ok", fn(item))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which re-raises it
            answer = ("error", exc)
        try:
            conn.send(answer)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception: say what it was
            conn.send(("error", RuntimeError(f"{type(answer[1]).__name__} could not be sent back: {exc}")))


class _Worker:
    def __init__(self, context, setup: Callable[..., None], setup_args: tuple) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_main, args=(child, setup, setup_args, os.getpid()), daemon=False)
        self.process.start()
        child.close()
        self.job: tuple[int, Any] | None = None        # (index, item) being run

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class WorkerPool:
    """``workers`` processes started with ``start_method`` (see the module docstring); a context manager."""

    def __init__(self, workers: int, setup: Callable[..., None], setup_args: tuple = (),
                 start_method: str = "spawn") -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.size, self.setup, self.setup_args = workers, setup, setup_args
        self.context = multiprocessing.get_context(start_method)
        self.workers: list[_Worker] = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the workers still running (a job in progress is lost)."""
        for worker in self.workers:
            if worker.job is None and worker.process.is_alive():
                try:
                    worker.conn.send(None)              # idle: let it exit on its own
                    worker.process.join(timeout=5)
                except (OSError, BrokenPipeError):
                    pass
            worker.stop()
        self.workers = []

    def _start(self) -> _Worker:
        worker = _Worker(self.context, self.setup, self.setup_args)
        self.workers.append(worker)
        return worker

    def imap_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any],
                       retries: int = 0) -> Iterator[tuple[Any, Any]]:
        """``(item, fn(item))`` as jobs finish, or ``(item, WorkerLost)`` for a job whose worker died
        ``1 + retries`` times. ``fn`` must be a module-level function (it is pickled to the workers)."""
        queue = deque(enumerate(items))
        attempts = [0] * len(items)
        while len(self.workers) < min(self.size, len(items)):
            self._start()
        busy = 0
        while queue or busy:
            for worker in self.workers:
                if worker.job is None and queue:
                    worker.job = queue.popleft()
                    attempts[worker.job[0]] += 1
                    worker.conn.send((fn, worker.job[1]))
                    busy += 1
            running = [w for w in self.workers if w.job is not None]
            ready = wait([w.conn for w in running] + [w.process.sentinel for w in running])
            for worker in running:
                index, item = worker.job
                if worker.conn in ready:
                    try:
                        status, value = worker.conn.recv()
                    except EOFError:            # the worker died: wait for its exit code below
                        worker.process.join()
                    else:
                        worker.job, busy = None, busy - 1
                        if status == "error":
                            raise value
                        yield item, value
                        continue
                if not worker.process.is_alive():
                    worker.process.join()
                    lost = WorkerLost(worker.process.exitcode, attempts[index])
                    worker.job, busy = None, busy - 1
                    worker.stop()
                    self.workers.remove(worker)
                    self._start()
                    if attempts[index] <= retries:
                        queue.appendleft((index, item))
                    else:
                        yield item, lost
