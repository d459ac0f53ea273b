"""Run a list of RunSpecs: on this machine (``local``, the default: ``jobs`` runs at once) or on a Ray cluster.

``local`` with ``jobs=1`` runs the specs one after the other in this process; with ``jobs=N`` it runs N at once in
worker processes (:mod:`clbench.workers`: forked for one-thread CPU runs on Linux, spawned otherwise), each with
``threads`` torch threads (:func:`plan`: by default one run per core with one thread each on CPU, which is what the
tiny models of the quick suite run fastest with). Each worker writes its records exactly as a sequential run does.
A run that raises is recorded as failed and the others go on; a worker process that dies during a run (killed, out
of memory) is replaced and the run tried again up to ``retries`` times, then recorded as failed with the reason.
Ray does the same with its own retries.

Independent work inside a run (the shard members of ``taft_shards``, ``model_soup``, ``sisa``) goes through the
task pool the executor installs around its runs (:mod:`clbench.tasks`): with ``shard_workers > 1``, a pool of that
many worker processes (``local``) or nested Ray tasks (``ray``); in the run's process otherwise. The pool does not
change results.

Both executors resume: a run whose record exists with status ``finished``, the same identity hash (same suite,
scenario, strategy, resolved hyperparameters and seed) and the same code fingerprint (:mod:`clbench.fingerprint`:
the source of the strategy, the scenario and the core they use) is skipped. Runs that are new, failed, made with
another configuration, made by other code or whose record is unreadable are run again; one line on stderr says how
many of each (``resuming: 10 of 12 runs already finished in results/quick; running 2: 2 made by other code``).
``force=True`` (``--force``) runs everything again. What a run to be run again wrote before (record, artifacts, state)
is moved to ``<out>/replaced/<stamp>__<run_id>/`` first, one line on stderr each (:mod:`clbench.replaced`); an
output folder whose ``runs/``, ``artifacts/``, ``state/`` or ``replaced/`` is a link is refused before any run.
Records are written atomically as each run ends, so an interrupted suite loses only the runs in progress: Ctrl-C or
SIGTERM cancels the pending runs, stops the running ones and keeps every finished record (:class:`Interrupted`: one
line saying so and how to resume); the same command resumes. Worker processes die with the driver, however it ends
(:func:`clbench.workers.die_with_parent`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from clbench import fingerprint, progress, replaced, tasks
from clbench import records as record_files
from clbench.callbacks import CALLBACKS
from clbench.config import config_hash
from clbench.environment import environment, resolve_device
from clbench.errors import ConfigError
from clbench.registry import SCENARIOS, STRATEGIES, Registry, load_plugins
from clbench.runner import RunRecord, record_path, run
from clbench.specs import RunSpec
from clbench.workers import WorkerLost, WorkerPool, start_method

log = logging.getLogger(__name__)
EXECUTORS: Registry = Registry("executor")

# why a run is (re)run -> how the resume line says it
REASONS = {"new": "new", "failed": "failed before", "config": "made with another configuration",
           "code": "made by other code (code fingerprint differs)", "corrupt": "with an unreadable or edited record"}


def record_status(spec: RunSpec, out_dir: str | Path) -> str:
    """``"done"`` when ``spec``'s record exists, finished, with the same identity and code fingerprint; otherwise
    why the run must run: a key of :data:`REASONS`."""
    path = record_path(out_dir, spec.run_id)
    if not path.exists():
        return "new"
    try:
        data = record_files.read(path)
    except record_files.CorruptRecord:
        return "corrupt"
    if data["spec"]["suite"] != spec.suite:
        return "suite"
    if data["status"] != "finished":
        return "failed"
    if data.get("identity_hash") != config_hash(spec.identity()):
        return "config"
    return "done" if data.get("code_fingerprint") == spec.code_fingerprint() else "code"


def is_done(spec: RunSpec, out_dir: str | Path) -> bool:
    return record_status(spec, out_dir) == "done"


def pending(specs: Iterable[RunSpec], out_dir: str | Path, force: bool = False) -> list[RunSpec]:
    """The specs to run, and one line on stderr about the others (printed whatever the log level), after one line
    per record that is edited or damaged (:func:`clbench.records.check`: its file and the field; it is run again,
    never counted as a result). A record of another suite where a run would write (run ids do not name the suite) is
    refused before any run, ``force`` or not: a :class:`~clbench.errors.ConfigError` naming the file, its suite and
    what to do."""
    specs = list(specs)
    status = {s.run_id: record_status(s, out_dir) for s in specs}
    other = [s for s in specs if status[s.run_id] == "suite"]
    if other:
        path = record_path(out_dir, other[0].run_id)
        raise ConfigError(f"{path} holds a run of the suite {record_files.read(path)['spec']['suite']!r}, not of "
                          f"{other[0].suite!r} ({len(other)} such record(s) in {Path(out_dir) / 'runs'}), and this "
                          f"suite would replace it: pass another --out (one folder per suite), or move those "
                          f"records away first.")
    replaced.refuse_links(out_dir)
    for spec in (s for s in specs if status[s.run_id] == "corrupt"):     # edited or damaged: say which field
        try:
            record_files.read(record_path(out_dir, spec.run_id))
        except record_files.CorruptRecord as exc:
            print(f"not a result, run again: {exc}", file=sys.stderr)
    done = sum(v == "done" for v in status.values())
    if force:
        if any(v != "new" for v in status.values()):
            print(f"--force: running all {len(specs)} runs again in {out_dir}", file=sys.stderr)
        return specs
    todo = [s for s in specs if status[s.run_id] != "done"]
    counts = Counter(status[s.run_id] for s in todo)
    if done or set(counts) - {"new"}:
        rerun = ", ".join(f"{counts[k]} {text}" for k, text in REASONS.items() if counts[k])
        print(f"resuming: {done} of {len(specs)} runs already finished in {out_dir}"
              + (f"; running {len(todo)}: {rerun}" if todo else ""), file=sys.stderr)
    return todo


def set_aside(todo: Iterable[RunSpec], out_dir: str | Path) -> None:
    """Before the runs of ``todo`` start, move what each wrote before in ``out_dir`` (record, artifacts, state) to
    ``<out_dir>/replaced/`` (:func:`clbench.replaced.set_aside`), one line on stderr per run saying what and where.
    Done by the driver, so that the Ray executor (whose workers may see another filesystem, and whose records the
    driver writes) keeps them too."""
    for spec in todo:
        kept = replaced.set_aside(out_dir, spec.run_id)
        if kept is not None:
            print(kept.line(), file=sys.stderr)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a SLURM or container limit)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan(jobs: int | None, threads: int | None, device: str = "cpu") -> tuple[int, int | None]:
    """``--jobs``/``--threads`` -> ``(runs at once, torch threads per run)``; ``None`` threads: torch's default.

    - ``jobs=None`` (auto) on CPU: one run per ``threads`` cores (``threads`` default 1), e.g. 2 runs x 1 thread on
      2 cores; on a GPU: one run at a time (runs would share the GPU's memory) with torch's default threads.
    - ``jobs=N``: N runs with ``threads``, by default ``cores // N`` each (at least 1).
    """
    cores = available_cores()
    if jobs is None:
        if resolve_device(device).type != "cpu":
            return 1, threads
        threads = threads or 1
        return max(1, cores // threads), threads
    if jobs > 1 and threads is None:
        threads = max(1, cores // jobs)
    return jobs, threads


@dataclass(frozen=True)
class WorkerSetup:
    """What a run needs in another process or on another machine besides its spec: torch threads, the data
    settings (``--data-root``/``--download``), the shard-member pool width, the modules that registered the names
    the specs use (so that plugins and test strategies exist there too) and this process's warning filters and log
    level. Picklable; :meth:`apply` makes a process ready to run specs."""

    threads: int | None
    shard_workers: int
    data: dict
    modules: tuple[str, ...]
    fingerprints: tuple[tuple[str, str, str], ...] = ()    # (strategy, scenario, code fingerprint)
    warning_filters: tuple = ()
    log_level: int = logging.WARNING

    @classmethod
    def here(cls, specs: Iterable[RunSpec], threads: int | None, shard_workers: int) -> WorkerSetup:
        from clbench.data.roots import download_enabled, search_roots

        factories = set()
        for spec in specs:
            factories |= {STRATEGIES.get(spec.strategy.name), SCENARIOS.get(spec.scenario.name)}
            factories |= {CALLBACKS.get(c["name"]) for c in spec.strategy.callbacks}
        modules = sorted({f.__module__ for f in factories} - {"__main__", "__mp_main__"})
        fingerprints = sorted({(s.strategy.name, s.scenario.name, s.code_fingerprint()) for s in specs})
        return cls(threads, shard_workers, {"data_root": str(search_roots()[0]), "download": download_enabled()},
                   tuple(modules), tuple(fingerprints), tuple(warnings.filters), logging.getLogger().level)

    def apply(self) -> None:
        from clbench.data import configure

        configure(**self.data)
        if self.threads:
            torch.set_num_threads(self.threads)
        logging.basicConfig(level=self.log_level, format="%(levelname)s %(message)s")
        progress.set_enabled(False)          # the driver shows one bar for the runs
        load_plugins()
        for module in self.modules:
            importlib.import_module(module)
        warnings.filters[:] = list(self.warning_filters)     # after the imports: some libraries add their own
        fingerprint.pin(self.fingerprints)                    # the driver's, taken when the suite started


def lost_record(spec: RunSpec, reason: str) -> RunRecord:
    """The ``failed`` record of a run whose process died (no result came back), with the reason."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    identity = spec.identity()
    return RunRecord(run_id=spec.run_id, status="failed", spec=spec.to_dict(), identity_hash=config_hash(identity),
                     seed=spec.seed, code_fingerprint=spec.code_fingerprint(),
                     strategy_config=identity["strategy"]["resolved"], env=environment(torch.device("cpu")),
                     started=now, finished=now, reason=reason)


class Interrupted(KeyboardInterrupt):
    """A suite stopped by Ctrl-C (SIGINT) or SIGTERM: the message says how many finished records are kept and how to
    resume; ``exit_code`` is the shell's for that signal (130, 143)."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the driver by :func:`interruptible` so that it stops as Ctrl-C does."""


@contextlib.contextmanager
def interruptible():
    """Within the block, SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) in the main thread, so that a
    terminated suite stops its workers and keeps its records as Ctrl-C does; the previous handler is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(records: list[RunRecord], cancelled: int, out_dir: str | Path, cause: BaseException) -> Interrupted:
    name = "SIGTERM" if isinstance(cause, Terminated) else "Ctrl-C"
    return Interrupted(f"interrupted ({name}): {len(records)} finished records are kept in {Path(out_dir) / 'runs'} "
                       f"({cancelled} runs cancelled or stopped); rerun the same command to resume.",
                       143 if isinstance(cause, Terminated) else 130)


@EXECUTORS.register("local")
class LocalExecutor:
    """Runs specs on this machine, ``jobs`` at once (``1``: in this process, one after the other; ``N``: in N worker
    processes, see :func:`clbench.workers.start_method`), each with ``threads`` torch threads (``None``: torch's
    default); their shard members in ``shard_workers`` processes. A worker that dies during a run is replaced and
    the run tried again up to ``retries`` times, then recorded as failed."""

    def __init__(self, shard_workers: int = 1, force: bool = False, jobs: int = 1, threads: int | None = None,
                 retries: int = 1, **_: object) -> None:
        if jobs < 1 or retries < 0:
            raise ValueError(f"jobs must be at least 1 and retries at least 0, got {jobs} and {retries}")
        self.shard_workers, self.force, self.jobs, self.threads, self.retries = (shard_workers, force, jobs,
                                                                                 threads, retries)

    def run_all(self, specs: list[RunSpec], out_dir: str | Path) -> list[RunRecord]:
        todo = pending(specs, out_dir, self.force)
        set_aside(todo, out_dir)
        if min(self.jobs, len(todo)) <= 1:
            return self._in_process(todo, out_dir)
        return self._in_workers(todo, out_dir)

    def _in_process(self, todo: list[RunSpec], out_dir: str | Path) -> list[RunRecord]:
        if self.threads:
            torch.set_num_threads(self.threads)
        records = []
        bar = progress.bar(todo, desc="runs", level="runs")
        try:
            with interruptible(), tasks.using(tasks.make_pool("process", self.shard_workers)):
                for spec in bar:
                    bar.set_postfix_str(spec.run_id)
                    records.append(run(spec, out_dir))
        except KeyboardInterrupt as exc:
            raise _interrupted(records, len(todo) - len(records), out_dir, exc) from None
        return records

    def _in_workers(self, todo: list[RunSpec], out_dir: str | Path) -> list[RunRecord]:
        setup = WorkerSetup.here(todo, self.threads, self.shard_workers)
        jobs = [(spec.to_dict(), str(out_dir), setup.shard_workers) for spec in todo]
        order = {spec.run_id: k for k, spec in enumerate(todo)}
        records: list[RunRecord] = []
        bar = progress.bar(total=len(todo), desc=f"runs ({self.jobs} at once)", level="runs")
        try:
            accelerator = any(resolve_device(s.device).type != "cpu" for s in todo)
            with interruptible(), WorkerPool(min(self.jobs, len(todo)), setup.apply,
                                             start_method=start_method(self.threads, accelerator)) as pool:
                for (spec, _, _), outcome in pool.imap_unordered(_run_local, jobs, retries=self.retries):
                    if isinstance(outcome, WorkerLost):
                        outcome = lost_record(RunSpec.from_dict(spec), outcome.reason)
                        outcome.write(record_path(out_dir, outcome.run_id))
                    records.append(outcome)
                    bar.set_postfix_str(outcome.run_id)
                    bar.update()
        except KeyboardInterrupt as exc:
            raise _interrupted(records, len(todo) - len(records), out_dir, exc) from None
        finally:
            bar.close()
        return sorted(records, key=lambda r: order[r.run_id])


def _run_local(job: tuple[dict, str, int]) -> RunRecord:
    """Worker-process body of the local executor: one run, its record written, its shard members in a pool."""
    spec, out_dir, shard_workers = job
    with tasks.using(tasks.make_pool("process", shard_workers)):
        return run(RunSpec.from_dict(spec), out_dir)


@EXECUTORS.register("ray")
class RayExecutor:
    """Runs specs as Ray tasks on ``address`` (``auto`` joins a running cluster; ``None`` starts a local one), one
    task per run asking for ``num_cpus``/``num_gpus`` (``--cpus-per-run``/``--gpus-per-run``) and running
    ``threads`` torch threads (default: ``num_cpus``). Records are returned to the driver, which writes them under
    ``out_dir``, so workers need no shared filesystem (strategy state saved by ``save_state`` stays on the worker
    unless ``out_dir`` is on a shared filesystem). A task whose worker dies is retried ``retries`` times by Ray, then
    recorded as failed with Ray's reason. Ctrl-C cancels the pending and running tasks; finished records stay. With
    ``shard_workers > 1`` a run's shard members are nested Ray tasks (at most ``shard_workers`` in flight per run)."""

    def __init__(self, address: str | None = None, num_cpus: float = 1, num_gpus: float = 0, shard_workers: int = 1,
                 force: bool = False, threads: int | None = None, retries: int = 1, **_: object) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("the ray executor needs Ray: pip install 'clbench[ray]' (or use --executor local)."
                               ) from exc
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=retries)(_run_remote)
        self.threads = threads or max(1, int(num_cpus))
        self.shard_workers, self.force, self.retries = shard_workers, force, retries

    def run_all(self, specs: list[RunSpec], out_dir: str | Path) -> list[RunRecord]:
        todo = pending(specs, out_dir, self.force)
        set_aside(todo, out_dir)
        setup = WorkerSetup.here(todo, self.threads, self.shard_workers)
        futures = {self.remote.remote(spec.to_dict(), str(out_dir), setup): spec for spec in todo}
        records: list[RunRecord] = []
        bar = progress.bar(total=len(futures), desc="runs (ray)", level="runs")
        remaining = list(futures)
        try:
            with interruptible():
                while remaining:
                    done, remaining = self.ray.wait(remaining, num_returns=1)
                    record = self._record(done[0], futures[done[0]])
                    record.write(record_path(out_dir, record.run_id))
                    records.append(record)
                    bar.update()
        except BaseException as exc:        # Ctrl-C, or a set-up error every run would repeat: stop the others
            for ref in remaining:
                self.ray.cancel(ref, force=True)
            if isinstance(exc, KeyboardInterrupt):
                raise _interrupted(records, len(remaining), out_dir, exc) from None
            raise
        finally:
            bar.close()
        return records

    def _record(self, ref, spec: RunSpec) -> RunRecord:
        """The task's record; a lost task (its worker died ``1 + retries`` times) gives a failed one. A set-up
        error every run would repeat (a missing dataset) is raised here, as the local executor does."""
        try:
            return RunRecord(**self.ray.get(ref))
        except self.ray.exceptions.RayTaskError as exc:
            raise exc.as_instanceof_cause() from None
        except self.ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return lost_record(spec, f"{type(exc).__name__}: {first} (tried {1 + self.retries} time(s))")


def _run_remote(spec: dict, out_dir: str, setup: WorkerSetup) -> dict:
    """Ray task body: one run on the worker (with the driver's setup, its shard members as nested Ray tasks); the
    record comes back as a dict."""
    setup.apply()
    with tasks.using(tasks.make_pool("ray", setup.shard_workers)):
        return dataclasses.asdict(run(RunSpec.from_dict(spec), out_dir))
