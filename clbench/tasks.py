"""Task pools: independent work items inside one run (the shard members of a sharded strategy), run in parallel.

A pool has one method, ``map(fn, items) -> [fn(item) for item in items]`` in item order. ``fn`` is a module-level
function and every item carries all that ``fn`` needs, so that both can be pickled to another process or machine::

    states = tasks.current().map(train_member, jobs)       # inside a run: the pool its executor installed

- ``sequential`` (the default): this process, one item after the other, no copies;
- ``process``: ``workers`` processes on this machine (:class:`clbench.workers.WorkerPool`, forked or spawned:
  :func:`clbench.workers.start_method`), torch threads split between them; they ignore Ctrl-C, die with the process
  that started them and are killed when the pool closes, a job in progress or not;
- ``ray``: Ray tasks, at most ``workers`` in flight; inside a Ray task too (nested tasks: Ray releases the caller's
  CPU while it waits in ``ray.get``).

Executors install a pool around the runs they execute (:func:`using`), chosen by :func:`make_pool` from their kind
and ``--shard-workers``. The pool is an execution setting, not part of a run's identity: when ``fn`` depends on its
item only (its randomness drawn from a seed in the item), every pool returns the same results bit for bit, given
the same torch threads per item.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from clbench.registry import Registry
from clbench.workers import WorkerLost, WorkerPool, start_method


class TaskPool(Protocol):
    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]: ...

    def close(self) -> None: ...


TASK_POOLS: Registry = Registry("task pool")


@TASK_POOLS.register("sequential")
class SequentialPool:
    """``fn`` on each item in this process, one after the other."""

    def __init__(self, workers: int = 1) -> None:
        pass

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return [fn(item) for item in items]

    def close(self) -> None:
        pass


def _apply(job: tuple[int, Callable[[Any], Any], Any]) -> Any:
    """A shard worker's body: ``fn(item)`` of a job ``(position, fn, item)``."""
    _, fn, item = job
    return fn(item)


@TASK_POOLS.register("process")
class ProcessPool:
    """``workers`` processes (:class:`clbench.workers.WorkerPool`: forked for one thread each on Linux unless CUDA is
    in use here, spawned otherwise) started on the first :meth:`map` and kept until :meth:`close`; each runs
    ``threads`` torch threads (default: this process's threads // workers, >= 1). They ignore Ctrl-C, die with this
    process, and :meth:`close` kills those still working: a run stopped by Ctrl-C or SIGTERM does not wait for its
    shard members to finish training (``concurrent.futures``' shutdown waited for every queued member: minutes)."""

    def __init__(self, workers: int, threads: int | None = None) -> None:
        self.workers = workers
        self.threads = threads or max(1, torch.get_num_threads() // workers)
        self._pool: WorkerPool | None = None

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if self._pool is None:
            self._pool = WorkerPool(self.workers, torch.set_num_threads, (self.threads,),
                                    start_method=start_method(self.threads, accelerator=False))
        results: dict[int, Any] = {}
        for (position, _, _), outcome in self._pool.imap_unordered(_apply, [(k, fn, item) for k, item in
                                                                            enumerate(items)]):
            if isinstance(outcome, WorkerLost):
                raise RuntimeError(f"shard member {position}: {outcome.reason}")
            results[position] = outcome
        return [results[k] for k in range(len(items))]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


@TASK_POOLS.register("ray")
class RayPool:
    """Each item a Ray task (``num_cpus``/``num_gpus`` each), at most ``workers`` in flight. Joins the running Ray
    instance (the cluster a Ray worker belongs to), or starts a local one."""

    def __init__(self, workers: int, num_cpus: float = 1, num_gpus: float = 0) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("the ray task pool needs Ray: pip install 'clbench[ray]'.") from exc
        self.ray, self.workers, self.resources = ray, workers, {"num_cpus": num_cpus, "num_gpus": num_gpus}
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        remote = self.ray.remote(**self.resources)(fn)
        refs: list = []
        for item in items:
            if len(refs) >= self.workers:       # wait until fewer than `workers` are unfinished
                self.ray.wait(refs, num_returns=len(refs) - self.workers + 1)
            refs.append(remote.remote(item))
        return self.ray.get(refs)

    def close(self) -> None:
        pass


def make_pool(kind: str, workers: int) -> TaskPool:
    """The ``kind`` pool (a :data:`TASK_POOLS` name) with ``workers`` workers; sequential for one worker."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    return TASK_POOLS.get("sequential" if workers == 1 else kind)(workers)


_CURRENT: contextvars.ContextVar[TaskPool | None] = contextvars.ContextVar("task_pool", default=None)


def current() -> TaskPool:
    """The pool installed by the enclosing :func:`using` (sequential outside any)."""
    return _CURRENT.get() or SequentialPool()


@contextlib.contextmanager
def using(pool: TaskPool) -> Iterator[TaskPool]:
    """Install ``pool`` as :func:`current` for the block and close it when the block ends."""
    token = _CURRENT.set(pool)
    try:
        yield pool
    finally:
        _CURRENT.reset(token)
        pool.close()
