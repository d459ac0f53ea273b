"""Run a list of RunSpecs: in this process (``local``, the default) or on a Ray cluster (``ray``).

Independent work inside a run (the shard members of ``taft_shards``, ``model_soup``, ``sisa``) goes through the
task pool the executor installs around its runs (:mod:`clbench.tasks`): with ``shard_workers > 1``, a pool of that
many spawned processes (``local``) or nested Ray tasks (``ray``); in the run's process otherwise. The pool does not
change results.

Both executors resume: a run whose record exists with status ``finished``, the same identity hash (same suite,
scenario, strategy, resolved hyperparameters and seed) and the same code fingerprint (:mod:`clbench.fingerprint`:
the source of the strategy, the scenario and the core they use) is skipped. Runs that are new, failed, made with
another configuration, made by other code or whose record is unreadable are run again; one line on stderr says how
many of each (``resuming: 10 of 12 runs already finished in results/quick; running 2: 2 made by other code``).
``force=True`` (``--force``) runs everything again. Records are written atomically as each run ends, so an
interrupted suite loses only the run in progress.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from clbench import progress, tasks
from clbench import records as record_files
from clbench.config import RunSpec, config_hash
from clbench.registry import Registry
from clbench.runner import RunRecord, record_path, run

log = logging.getLogger(__name__)
EXECUTORS: Registry = Registry("executor")

# why a run is (re)run -> how the resume line says it
REASONS = {"new": "new", "failed": "failed before", "config": "made with another configuration",
           "code": "made by other code (code fingerprint differs)", "corrupt": "with an unreadable record"}


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
    if data["status"] != "finished":
        return "failed"
    if data.get("identity_hash") != config_hash(spec.identity()):
        return "config"
    return "done" if data.get("code_fingerprint") == spec.code_fingerprint() else "code"


def is_done(spec: RunSpec, out_dir: str | Path) -> bool:
    return record_status(spec, out_dir) == "done"


def pending(specs: Iterable[RunSpec], out_dir: str | Path, force: bool = False) -> list[RunSpec]:
    """The specs to run, and one line on stderr about the others (printed whatever the log level)."""
    specs = list(specs)
    status = {s.run_id: record_status(s, out_dir) for s in specs}
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


@EXECUTORS.register("local")
class LocalExecutor:
    """Runs specs one after the other in this process; their shard members in ``shard_workers`` processes."""

    def __init__(self, shard_workers: int = 1, force: bool = False, **_: object) -> None:
        self.shard_workers, self.force = shard_workers, force

    def run_all(self, specs: list[RunSpec], out_dir: str | Path) -> list[RunRecord]:
        todo = pending(specs, out_dir, self.force)
        records = []
        bar = progress.bar(todo, desc="runs", level="runs")
        try:
            with tasks.using(tasks.make_pool("process", self.shard_workers)):
                for spec in bar:
                    bar.set_postfix_str(spec.run_id)
                    records.append(run(spec, out_dir))
        except KeyboardInterrupt:
            log.warning("interrupted: %d finished records are kept in %s; rerun the same command to resume.",
                        len(records), Path(out_dir) / "runs")
            raise
        return records


@EXECUTORS.register("ray")
class RayExecutor:
    """Runs specs as Ray tasks (one task per run, ``num_cpus``/``num_gpus`` each) on ``address`` (``auto`` joins a
    running cluster; ``None`` starts a local one). Records are returned to the driver, which writes them under
    ``out_dir``, so workers need no shared filesystem (strategy state saved by ``save_state`` stays on the worker
    unless ``out_dir`` is on a shared filesystem). With ``shard_workers > 1`` a run's shard members are nested Ray
    tasks (at most ``shard_workers`` in flight per run)."""

    def __init__(self, address: str | None = None, num_cpus: float = 1, num_gpus: float = 0, shard_workers: int = 1,
                 force: bool = False, **_: object) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("the ray executor needs Ray: pip install 'clbench[ray]' (or use --executor local)."
                               ) from exc
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_run_remote)
        self.shard_workers, self.force = shard_workers, force

    def run_all(self, specs: list[RunSpec], out_dir: str | Path) -> list[RunRecord]:
        todo = pending(specs, out_dir, self.force)
        from clbench.data.roots import download_enabled, search_roots

        data = {"data_root": str(search_roots()[0]), "download": download_enabled()}   # --data-root/--download
        futures = {self.remote.remote(spec.to_dict(), str(out_dir), data, self.shard_workers): spec for spec in todo}
        records = []
        bar = progress.bar(total=len(futures), desc="runs (ray)", level="runs")
        remaining = list(futures)
        while remaining:
            done, remaining = self.ray.wait(remaining, num_returns=1)
            record = RunRecord(**self.ray.get(done[0]))
            record.write(record_path(out_dir, record.run_id))
            records.append(record)
            bar.update()
        bar.close()
        return records


def _run_remote(spec: dict, out_dir: str, data: dict, shard_workers: int) -> dict:
    """Ray task body: one run on the worker (with the driver's data settings, its shard members as nested Ray
    tasks); the record comes back as a dict."""
    import dataclasses

    from clbench.data import configure

    configure(**data)
    with tasks.using(tasks.make_pool("ray", shard_workers)):
        return dataclasses.asdict(run(RunSpec.from_dict(spec), out_dir))
