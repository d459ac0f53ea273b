"""``clbench run`` (the default command: ``clbench --suite quick`` is ``clbench run --suite quick``): run a suite,
resuming from the records already in ``--out``, then write its leaderboard and report.

Everything that can be checked is checked before the first run (:func:`run`): the suite, the flags, the device, the
output folder, the executor and the checkpoint files the runs read; each problem is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from clbench.commands import Command
from clbench.errors import ConfigError
from clbench.files import LOCK_FILE, locked_folder
from clbench.preflight import (
    check_file_size_limit,
    check_gpu_present,
    check_output_links,
    check_selection,
    check_suite_checkpoints,
    check_suite_datasets,
    refuse_missing_checkpoints,
)
from clbench.registry import COMMANDS, STRATEGIES
from clbench.suite_file import load_suite, suite_name


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="quick", help="shipped suite name or path of a suite .yaml (default: quick)")
    p.add_argument("--scenario", nargs="+",
                   help="only these scenarios of the suite: rows by their exact label, or name when unlabelled; a "
                        "name no row is labelled with picks every row of that scenario")
    p.add_argument("--strategy", nargs="+",
                   help="only these strategies of the suite: rows by their exact label, or name when unlabelled "
                        "(naive runs the row naive, not naive_dp_eps8); a name no row is labelled with picks every "
                        "row of that strategy")
    p.add_argument("--seeds", nargs="+", type=int, help="replace the suite's seeds")
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu or cuda[:N]")
    p.add_argument("--amp", action="store_true",
                   help="bf16 autocast on CPU and CUDA (matrix products in bf16, weights and optimizer in float32; "
                        "part of the run identity); refused on mps and with private training (dp)")
    p.add_argument("--out", help="output folder (default: results/<suite>)")
    p.add_argument("--executor", default="local", help="local (default) or ray")
    p.add_argument("--jobs", type=_jobs, default=None,
                   help="local executor: runs at once, each in a worker process (default: $CLBENCH_JOBS, "
                        "else auto = one run per core with 1 torch thread each on CPU, one at a time on a GPU)")
    p.add_argument("--retries", type=int, default=1,
                   help="run again a run whose worker process died (killed, out of memory) up to N times, then "
                        "record it as failed (default 1; --jobs > 1 and ray)")
    p.add_argument("--ray-address", default=None, help="Ray cluster address (ray executor; 'auto' joins one)")
    p.add_argument("--cpus-per-run", type=float, default=None,
                   help="ray executor: CPUs each run's task asks for (default 1; its torch threads unless --threads)")
    p.add_argument("--gpus-per-run", type=float, default=None,
                   help="ray executor: GPUs each run's task asks for (default 0; fractions share a GPU)")
    p.add_argument("--shard-workers", type=int, default=1,
                   help="train up to N shard members of a run at once (taft_shards, model_soup, sisa): N worker "
                        "processes (local executor) or nested Ray tasks (ray); same results as 1 (default)")
    p.add_argument("--init", help="local checkpoint: sets the 'init' hyperparameter of every strategy that has one")
    p.add_argument("--force", action="store_true",
                   help="run every run again, even those whose finished record matches the configuration and code")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads of each run (default: 1 with --jobs auto on CPU, cores // jobs "
                        "otherwise; with --jobs auto, runs at once = cores // threads). Tiny models run faster on 1: "
                        "DyTox micro trained 37.5 s with 1 thread vs 99.7 s with 2")


def _jobs(value: str) -> int | str:
    """``--jobs`` (and ``$CLBENCH_JOBS``): ``auto`` or a whole number of runs at once."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of runs at once, got {value!r}") from None


def _jobs_default() -> int | str:
    try:
        jobs = _jobs(os.environ.get("CLBENCH_JOBS", "auto"))
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"$CLBENCH_JOBS: {exc}; unset it or give --jobs.") from None
    if jobs != "auto" and jobs < 1:
        raise ConfigError(f"$CLBENCH_JOBS must be at least 1, got {jobs}; unset it or give --jobs.")
    return jobs


def _with_init(suite, init: str | None):
    """Set ``init`` in the args of each strategy whose Config has that field."""
    if not init:
        return suite
    entries = []
    for e in suite.strategies:
        fields = {f.name for f in dataclasses.fields(STRATEGIES.get(e.name).Config)}
        entries.append(dataclasses.replace(e, args={**e.args, "init": init}) if "init" in fields else e)
    return dataclasses.replace(suite, strategies=tuple(entries))


def run(args: argparse.Namespace) -> int:
    """Everything that can be checked is checked before the first run: the suite, the flags, the device, the
    output folder (held locked while the suite runs: a second suite into it is refused), the executor and the
    pre-flight of what the runs will use; each problem is one line and exit code 2, and leaves no output folder
    behind (folders are made when the runs start)."""
    from clbench.fingerprint import check_one_tree

    check_one_tree()
    _check_before_imports(args)
    suite = _with_init(load_suite(args.suite).select(args.scenario, args.strategy, args.seeds), args.init)
    from clbench.environment import resolve_device  # imports torch: after the suite, so a malformed one is quick
    from clbench.estimates import notice

    if estimate := notice(suite.name, str(resolve_device(args.device))):     # a *_full suite starting on a CPU
        print(estimate, file=sys.stderr)
    specs = suite.run_specs(device=args.device, amp=args.amp)        # --amp refused here with dp or on mps
    out = output_folder(args.out, suite.name)
    check_output_folder(out)
    return _run_suite(args, suite, specs, out)


def _run_suite(args: argparse.Namespace, suite, specs, out: Path) -> int:
    import torch

    from clbench.commands.leaderboard import write_tables  # records: numpy, not for `run --help`
    from clbench.executors import EXECUTORS, plan
    from clbench.preflight import preflight

    jobs = args.jobs if args.jobs is not None else _jobs_default()
    jobs, threads = plan(None if jobs == "auto" else jobs, args.threads, args.device)
    try:
        executor = EXECUTORS.get(args.executor)(
            address=args.ray_address, shard_workers=args.shard_workers, force=args.force, jobs=jobs,
            threads=threads if args.executor == "local" else args.threads,
            retries=args.retries, num_cpus=args.cpus_per_run or 1, num_gpus=args.gpus_per_run or 0)
    except (ImportError, RuntimeError, ConnectionError) as exc:
        raise ConfigError(f"--executor {args.executor}: {exc}") from None
    check_checkpoints(specs)
    preflight(specs, out)
    if not args.force:
        from clbench.executors import is_done
        from clbench.loggers import resumed_observers

        unlogged = resumed_observers(specs, lambda spec: is_done(spec, out), out)
        if unlogged:
            print(unlogged, file=sys.stderr)
    at_once = f"{jobs} at once, " if args.executor == "local" else ""
    print(f"suite {suite.name}: {len(specs)} runs ({len(suite.scenarios)} scenarios x {len(suite.strategies)} "
          f"strategies x {len(suite.seeds)} seeds; {at_once}{threads or torch.get_num_threads()} torch thread(s) "
          f"each) -> {out}", file=sys.stderr)
    with locked_folder(out, f"the suite {suite.name} (run)"):    # a second writer is refused, naming this suite
        records = executor.run_all(specs, out)
        failed = [r for r in records if r.status != "finished"]
        for r in failed:
            print(f"FAILED {r.run_id}: {r.reason}", file=sys.stderr)
        table, _ = write_tables(out)
    if not args.quiet_table:
        print((out / "leaderboard.md").read_text())
    print(f"leaderboard: {out / 'leaderboard.csv'} ({len(table)} rows), report: {out / 'report.md'}; {len(failed)} "
          "failed run(s) this time",
          file=sys.stderr)
    return 1 if failed else 0


def _check_before_imports(args: argparse.Namespace) -> None:
    """What the command line alone decides, refused before the suite's modules (and torch) are imported: the
    flags, ``$CLBENCH_JOBS``, the file size limit, ``--device cuda`` on a machine without a GPU, the output folder
    (writable, not in use by another suite: its name read from the suite file when ``--out`` is not given), the
    ``--init`` file, the checkpoint files the suite's selected entries name and the datasets their scenarios
    read."""
    _check_flags(args)
    if args.jobs is None:
        _jobs_default()
    check_file_size_limit()
    check_gpu_present(args.device)
    name = suite_name(args.suite)
    if args.out is not None or name is not None:
        out = output_folder(args.out, name or "")
        check_output_links(out)
        check_output_folder(out)
        if (out / LOCK_FILE).is_file():     # in use now: taking the lock for a moment refuses it (nothing created)
            with locked_folder(out, f"the suite {name or args.suite} (run)"):
                pass
    if args.init and "{scenario}" not in args.init and not Path(args.init).is_file():
        raise ConfigError(f"checkpoint file(s) not found: {args.init}, given by --init. Create it with `python "
                          f"run_bench.py pretrain` (the commands are in docs/petl.md and docs/tangent.md) or pass a "
                          f"local file.")
    check_suite_checkpoints(args.suite, args.scenario, args.strategy, args.init)
    check_suite_datasets(args.suite, args.scenario)
    check_selection(args.suite, args.scenario, args.strategy, args.seeds)


def _check_flags(args: argparse.Namespace) -> None:
    """Counts out of range, and flags of one executor given to the other: one :class:`ConfigError` line each."""
    for flag in ("threads", "shard_workers", "jobs"):
        value = getattr(args, flag)
        if isinstance(value, int) and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1, got {value}.")
    if args.retries < 0:
        raise ConfigError(f"--retries must be at least 0, got {args.retries}.")
    for flag in ("cpus_per_run", "gpus_per_run"):
        value = getattr(args, flag)
        if value is not None and (args.executor != "ray" or value < 0 or flag == "cpus_per_run" and value == 0):
            raise ConfigError(f"--{flag.replace('_', '-')} {value:g}: a Ray resource request, for --executor ray "
                              f"only, {'above 0' if flag == 'cpus_per_run' else 'at least 0'}; with the local "
                              f"executor use --jobs and --threads.")
    if args.executor != "local" and args.jobs is not None:
        raise ConfigError("--jobs is for the local executor; Ray runs as many runs at once as the cluster has CPUs "
                          "for (--cpus-per-run each).")


def check_checkpoints(specs) -> None:
    """One :class:`ConfigError` line naming the checkpoint files (``init``, with ``{scenario}`` replaced) that the
    runs would read and that do not exist or cannot be read, before the first run (each run would fail on it
    otherwise)."""
    from clbench.config import checkpoint_paths, config_dict

    missing: dict[str, dict[str, None]] = {}
    for spec in specs:
        for field, path in checkpoint_paths(config_dict(spec.config()), spec.scenario.name).items():
            if not Path(path).is_file():
                missing.setdefault(path, {})[f"{spec.strategy.key} ({field}) on {spec.scenario.key}"] = None
    refuse_missing_checkpoints({path: list(users) for path, users in missing.items()})
    _check_readable(sorted({path for spec in specs for path in checkpoint_paths(config_dict(spec.config()),
                                                                                 spec.scenario.name).values()}))


def _check_readable(paths: list[str]) -> None:
    """Open each checkpoint file once: a truncated or foreign file is one line naming it, before the first run
    (each run would fail on it with the reader's error, which does not name the file)."""
    from clbench.models.checkpoint import read_state_dict

    for path in paths:
        try:
            read_state_dict(path)
        except Exception as exc:  # noqa: BLE001 - whatever the reader raises, the file is unusable
            cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            raise ConfigError(f"checkpoint file {path} cannot be read ({cause}); it is cut short or not a "
                              f"checkpoint: make it again (`python run_bench.py pretrain`) or set init / --init to "
                              f"another file.") from None


def output_folder(given: str | None, suite: str) -> Path:
    """``--out`` as a folder: ``results/<suite>`` when not given; an empty or blank value is refused (it would
    silently become the current folder's ``results/<suite>``)."""
    if given is None:
        return Path("results") / suite
    if not given.strip():
        raise ConfigError(f"--out {given!r} names no folder; give a folder, or leave --out out for results/{suite}.")
    return Path(given)


def check_output_folder(out: Path) -> None:
    """Write and remove a file in ``out/runs``, ``out/artifacts`` and ``out/state`` where they exist, else in the
    nearest folder above them that exists, so that an unusable ``--out`` (read-only, full, not a folder) fails
    before the first run, not in each run. Nothing is created: a suite refused before its first run leaves no
    folder behind."""
    probed = set()
    for sub in ("runs", "artifacts", "state"):
        folder = out / sub
        while not folder.exists() and folder.parent != folder:
            folder = folder.parent
        if folder in probed:
            continue
        probed.add(folder)
        probe = folder / f".write-test-{os.getpid()}"
        try:
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"output folder {out} cannot be written to ({exc.strerror or exc}: "
                              f"{exc.filename or probe}); pass another --out.") from None


COMMANDS.register("run")(Command("run a suite (the default command)", _add_arguments, run))
