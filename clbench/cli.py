"""``run_bench.py``: run a suite, list the registries, rebuild a leaderboard, and the commands plugins register.

::

    python run_bench.py --suite quick                       # run (the default command); resumes
    python run_bench.py --suite cifar100 --strategy replay --seeds 0 1 --device cuda --amp
    python run_bench.py list [--markdown]                  # scenarios, strategies, models, suites
    python run_bench.py leaderboard --out results/quick    # rebuild CSV/markdown/plots/report.md from records
    python run_bench.py report --out results/quick         # the same; prints where report.md is

A feature module adds a sub-command by registering a :class:`Command` in ``clbench.registry.COMMANDS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from clbench import progress
from clbench import records as record_files
from clbench.config import ConfigError, build_config, load_suite, shipped_suites
from clbench.environment import resolve_device
from clbench.registry import COMMANDS, MODELS, SCENARIOS, STRATEGIES, UNAVAILABLE, UnknownNameError


@dataclass(frozen=True)
class Command:
    """A sub-command: ``add_arguments(parser)`` declares its flags, ``run(args) -> exit code`` executes it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def quiet_third_party_warnings() -> None:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message="No loggers specified")
    warnings.filterwarnings("ignore", message=".*QP solver.*")
    # torch's notice about Avalanche's list indexing in its replay buffers (avalanche/training/utils.py); printed
    # again for every run (each strategy's catch_warnings resets the once-per-location registry)
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional indexing")


# ----------------------------------------------------------------------------------------------------------- run
def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="quick", help="shipped suite name or path of a suite .yaml (default: quick)")
    p.add_argument("--scenario", nargs="+", help="only these scenarios of the suite (names or labels)")
    p.add_argument("--strategy", nargs="+", help="only these strategies of the suite (names or labels)")
    p.add_argument("--seeds", nargs="+", type=int, help="replace the suite's seeds")
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu or cuda[:N]")
    p.add_argument("--amp", action="store_true", help="bf16 autocast on GPU")
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


def _run(args: argparse.Namespace) -> int:
    """Everything that can be checked is checked before the first run: the suite, the flags, the device, the
    output folder and the executor; each problem is one line and exit code 2."""
    from clbench.executors import EXECUTORS, plan

    suite = _with_init(load_suite(args.suite).select(args.scenario, args.strategy, args.seeds), args.init)
    _check_flags(args)
    resolve_device(args.device)
    out = Path(args.out or Path("results") / suite.name)
    check_output_folder(out)
    jobs = args.jobs if args.jobs is not None else _jobs_default()
    jobs, threads = plan(None if jobs == "auto" else jobs, args.threads, args.device)
    try:
        executor = EXECUTORS.get(args.executor)(
            address=args.ray_address, shard_workers=args.shard_workers, force=args.force, jobs=jobs,
            threads=threads if args.executor == "local" else args.threads,
            retries=args.retries, num_cpus=args.cpus_per_run or 1, num_gpus=args.gpus_per_run or 0)
    except (ImportError, RuntimeError, ConnectionError) as exc:
        raise ConfigError(f"--executor {args.executor}: {exc}") from None
    specs = suite.run_specs(device=args.device, amp=args.amp)
    at_once = f"{jobs} at once, " if args.executor == "local" else ""
    print(f"suite {suite.name}: {len(specs)} runs ({len(suite.scenarios)} scenarios x {len(suite.strategies)} "
          f"strategies x {len(suite.seeds)} seeds; {at_once}{threads or torch.get_num_threads()} torch thread(s) "
          f"each) -> {out}", file=sys.stderr)
    records = executor.run_all(specs, out)
    failed = [r for r in records if r.status != "finished"]
    for r in failed:
        print(f"FAILED {r.run_id}: {r.reason}", file=sys.stderr)
    table, _ = _write_leaderboard(out)
    if not args.quiet_table:
        print((out / "leaderboard.md").read_text())
    print(f"leaderboard: {out / 'leaderboard.csv'} ({len(table)} rows), report: {out / 'report.md'}; {len(failed)} "
          "failed run(s) this time",
          file=sys.stderr)
    return 1 if failed else 0


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


def check_output_folder(out: Path) -> None:
    """Create ``out/runs`` and write a file there, so that an unusable ``--out`` fails before the first run."""
    probe = out / "runs" / f".write-test-{os.getpid()}"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output folder {out} cannot be written to ({exc.strerror or exc}: "
                          f"{exc.filename or probe}); pass another --out.") from None


def _write_leaderboard(out: Path):
    """Leaderboard files and plots from the valid records in ``out``; every file in ``runs/`` that is not a record
    is reported by path on stderr and skipped. Returns ``(table, corrupt files)``."""
    from clbench import leaderboard, report, suite_report

    records, corrupt = record_files.load_dir(out)
    for problem in corrupt:
        print(f"warning: {problem}; skipped", file=sys.stderr)
    table = leaderboard.write(out, records)
    suite_report.write(out, records, report.plot(records, out))
    return table, corrupt


# ---------------------------------------------------------------------------------------------------------- list
def _first_line(obj) -> str:
    return (inspect.getdoc(obj) or "").split("\n")[0]


def _list(args: argparse.Namespace) -> int:
    fmt = (lambda name, doc: f"- `{name}`: {doc}") if args.markdown else (lambda name, doc: f"  {name:22s} {doc}")
    print("## Scenarios" if args.markdown else "scenarios:")
    for name in SCENARIOS.names():
        print(fmt(name, _first_line(SCENARIOS.get(name))))
    print("\n## Strategies" if args.markdown else "strategies:")
    for name in STRATEGIES.names():
        cls = STRATEGIES.get(name)
        presets = ", ".join(getattr(cls, "PRESETS", {})) or "none"
        print(fmt(name, f"{_first_line(cls)} (presets: {presets})"))
    for module, reason in sorted(UNAVAILABLE.items()):
        print(fmt(module, f"UNAVAILABLE: {reason}"))
    print("\n## Models" if args.markdown else "models:")
    for name in MODELS.names():
        print(fmt(name, _first_line(MODELS.get(name))))
    print("\n## Suites" if args.markdown else "suites:")
    for name, path in sorted(shipped_suites().items()):
        description = " ".join(str(yaml.safe_load(path.read_text()).get("description", "")).split())
        print(fmt(name, description.split(". ")[0].rstrip(".") + "."))
    return 0


def _show_config(args: argparse.Namespace) -> int:
    """Print a strategy's resolved hyperparameters for a preset."""
    config = build_config(args.name, args.preset)
    for field in dataclasses.fields(config):
        print(f"{field.name} = {getattr(config, field.name)!r}")
    return 0


def _report(args: argparse.Namespace) -> int:
    """``report.md`` (with the leaderboard files and plots it shows); exit code 2 as for ``leaderboard``."""
    _, corrupt = _write_leaderboard(Path(args.out))
    print(f"report: {Path(args.out) / 'report.md'}"
          + (f"; {len(corrupt)} file(s) in runs/ skipped (see above)" if corrupt else ""), file=sys.stderr)
    return 2 if corrupt else 0


def _leaderboard(args: argparse.Namespace) -> int:
    """Exit code 2 when a file in ``runs/`` was not a record (the table is still written from the others)."""
    table, corrupt = _write_leaderboard(Path(args.out))
    print((Path(args.out) / "leaderboard.md").read_text())
    print(f"{len(table)} rows -> {Path(args.out) / 'leaderboard.csv'}"
          + (f"; {len(corrupt)} file(s) in runs/ skipped (see above)" if corrupt else ""), file=sys.stderr)
    return 2 if corrupt else 0


COMMANDS.register("run")(Command("run a suite (the default command)", _add_run_arguments, _run))
COMMANDS.register("list")(Command(
    "list scenarios, strategies, models and suites",
    lambda p: p.add_argument("--markdown", action="store_true", help="markdown lists (for the README)"), _list))
COMMANDS.register("config")(Command(
    "show a strategy's hyperparameters",
    lambda p: (p.add_argument("name"), p.add_argument("--preset")), _show_config))
COMMANDS.register("leaderboard")(Command(
    "rebuild leaderboard.csv/.md and plots from the records in --out",
    lambda p: p.add_argument("--out", required=True, help="a suite's output folder, e.g. results/quick; exit code 2 "
                                                        "when a file in its runs/ is not a run record (skipped)"),
    _leaderboard))
COMMANDS.register("report")(Command(
    "write report.md (leaderboard, plots, per-scenario summary, machine and code) from the records in --out",
    lambda p: p.add_argument("--out", required=True, help="a suite's output folder, e.g. results/quick"), _report))


# ---------------------------------------------------------------------------------------------------------- main
def _common_arguments() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", action="store_true", help="no progress bars")
    common.add_argument("--quiet-table", action="store_true", help="do not print the leaderboard at the end")
    common.add_argument("--data-root", help="first folder to look for datasets in (before $CLBENCH_DATA)")
    common.add_argument("--download", action="store_true", help="download missing datasets (needs internet)")
    common.add_argument("-v", "--verbose", action="store_true")
    return common


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run_bench.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    common = _common_arguments()
    for name in COMMANDS.names():
        command: Command = COMMANDS.get(name)
        command.add_arguments(sub.add_parser(name, help=command.help, parents=[common]))
    return parser


def main(argv: list[str] | None = None) -> int:
    quiet_third_party_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS.names() and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]          # `run_bench.py --suite quick` means `run_bench.py run --suite quick`
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    progress.set_enabled(not args.quiet)
    _configure_data(args)
    try:
        return COMMANDS.get(args.command).run(args)
    except (ConfigError, UnknownNameError, FileNotFoundError, record_files.CorruptRecord) as exc:
        # DatasetNotFound (a missing dataset, or a ChecksumMismatch) included: every run would fail the same way
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished runs are kept; rerun the same command to resume.", file=sys.stderr)
        return 130


def _configure_data(args: argparse.Namespace) -> None:
    from clbench.data import configure

    configure(data_root=args.data_root, download=args.download)


if __name__ == "__main__":
    sys.exit(main())
