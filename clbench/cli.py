"""``clbench`` (also ``python -m clbench`` and ``python run_bench.py``): run a suite, list the registries, rebuild
a leaderboard, and the commands plugins register.

::

    clbench --suite quick                                  # run (the default command); resumes
    clbench --suite cifar100 --strategy replay --seeds 0 1 --device cuda --amp
    clbench --plugins my_methods.py --suite my_suite.yaml  # with a strategy of your own (see clbench.registry)
    clbench list [--markdown]                              # scenarios, strategies, models, callbacks, suites
    clbench leaderboard --out results/quick                # rebuild CSV/markdown/plots/report.md from records
    clbench report --out results/quick                     # the same; prints where report.md is

A feature module adds a sub-command by registering a :class:`Command` in ``clbench.registry.COMMANDS``. Only the
chosen command's module is imported (and torch only by the commands that train): ``--help`` and ``list`` read the
registries' index.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from clbench import __version__
from clbench import records as record_files
from clbench.config import build_config
from clbench.errors import ConfigError, OutputError
from clbench.registry import (
    CALLBACKS,
    COMMANDS,
    MODELS,
    SCENARIOS,
    STRATEGIES,
    UNAVAILABLE,
    PluginError,
    Registry,
    UnknownNameError,
    load_plugin,
    load_plugins,
)
from clbench.suite_file import load_suite, shipped_suites


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
    import torch

    from clbench.environment import resolve_device
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
    check_checkpoints(specs)
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


def check_checkpoints(specs) -> None:
    """One :class:`ConfigError` line naming the checkpoint files (``init``, with ``{scenario}`` replaced) that the
    runs would read and that do not exist, before the first run (each run would fail on it otherwise)."""
    from clbench.config import checkpoint_paths, config_dict

    missing: dict[str, dict[str, None]] = {}
    for spec in specs:
        for field, path in checkpoint_paths(config_dict(spec.config()), spec.scenario.name).items():
            if not Path(path).is_file():
                missing.setdefault(path, {})[f"{spec.strategy.key} ({field}) on {spec.scenario.key}"] = None
    if missing:
        listed = "; ".join(f"{path}, read by {next(iter(users))}" + (f" and {len(users) - 1} more" if len(users) > 1
                                                                      else "") for path, users in missing.items())
        raise ConfigError(f"checkpoint file(s) not found: {listed}. Create them with `python run_bench.py pretrain` "
                          f"(the commands are in docs/petl.md and docs/tangent.md) or set init / --init to a local "
                          f"file.")


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
LISTED: tuple[tuple[str, Registry], ...] = (("Scenarios", SCENARIOS), ("Strategies", STRATEGIES), ("Models", MODELS),
                                           ("Callbacks", CALLBACKS))
README_MARKERS = ("<!-- lists:start -->\n", "<!-- lists:end -->")


def list_lines(markdown: bool = False, shipped: bool = False) -> list[str]:
    """What ``clbench list`` prints: every name of :data:`LISTED` with its one-line summary (shipped names from the
    registries' index: no module is imported for them), the plugin modules that failed to load, and the shipped
    suites. ``shipped``: only what ships with clbench (the README's lists)."""
    fmt = (lambda name, doc: f"- `{name}`: {doc}") if markdown else (lambda name, doc: f"  {name:22s} {doc}")
    lines = []
    for title, registry in LISTED:
        lines.append(f"### {title}" if markdown else f"{title.lower()}:")
        for name in registry.names():
            if not shipped or registry.module_of(name).startswith("clbench."):
                lines.append(fmt(name, _describe(registry, name)))
        if registry is STRATEGIES and not shipped:
            lines += [fmt(module, f"UNAVAILABLE: {reason}") for module, reason in sorted(UNAVAILABLE.items())]
        lines.append("")
    lines.append("### Suites" if markdown else "suites:")
    for name, path in sorted(shipped_suites().items()):
        description = " ".join(str(yaml.safe_load(path.read_text()).get("description", "")).split())
        lines.append(fmt(name, description.split(". ")[0].rstrip(".") + "."))
    return lines


def _describe(registry: Registry, name: str) -> str:
    try:
        return registry.describe(name)
    except UnknownNameError as exc:          # its module failed to load (listed below the strategies)
        return f"UNAVAILABLE: {exc}"


def write_readme_lists(readme: Path) -> None:
    """Replace the block between :data:`README_MARKERS` in ``readme`` with the shipped lists (``make lists``)."""
    text = readme.read_text()
    head, rest = text.split(README_MARKERS[0])
    _, tail = rest.split(README_MARKERS[1])
    readme.write_text(head + README_MARKERS[0] + "\n".join(list_lines(markdown=True, shipped=True)) + "\n"
                      + README_MARKERS[1] + tail)


def _list(args: argparse.Namespace) -> int:
    if args.check:
        load_plugins()
    if args.readme:
        write_readme_lists(Path(args.readme))
        print(f"wrote the lists of shipped names into {args.readme}", file=sys.stderr)
        return 0
    print("\n".join(list_lines(args.markdown, args.shipped)))
    return 0


def _list_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", action="store_true", help="markdown lists")
    p.add_argument("--shipped", action="store_true", help="only what ships with clbench (no plugins)")
    p.add_argument("--readme", metavar="PATH", help="write the shipped lists into PATH's lists block (make lists)")
    p.add_argument("--check", action="store_true",
                   help="import every plugin module first (slow; list reads the index): shows those that fail")


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
COMMANDS.register("list")(Command("list scenarios, strategies, models, callbacks and suites", _list_arguments, _list))
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
    _plugins_argument(common)
    common.add_argument("-v", "--verbose", action="store_true")
    return common


def _plugins_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugins", nargs="+", default=[], metavar="MODULE_OR_FILE",
                        help="import these modules or .py files first: strategies, scenarios, models, callbacks or "
                             "commands of your own (installed packages declare theirs with an entry point)")


def _parser(prog: str, command: str | None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported for its arguments (the others show their help line)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"clbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command")
    common = _common_arguments()
    for name in COMMANDS.names():
        subparser = sub.add_parser(name, help=COMMANDS.describe(name), parents=[common])
        if name == command:
            COMMANDS.get(name).add_arguments(subparser)
    return parser


def _prog() -> str:
    """The program's name as the user typed it: ``clbench``, ``run_bench.py`` or ``python -m clbench``."""
    name = Path(sys.argv[0]).name
    return "python -m clbench" if name == "__main__.py" else name or "clbench"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    quiet_third_party_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    early = argparse.ArgumentParser(add_help=False)
    _plugins_argument(early)
    try:
        for plugin in early.parse_known_args(argv)[0].plugins:      # before the names are read: they may add some
            load_plugin(plugin)
        if not argv or argv[0] not in COMMANDS.names() and argv[0] not in ("-h", "--help", "--version"):
            argv = ["run", *argv]          # `clbench --suite quick` means `clbench run --suite quick`
        args = _parser(prog or _prog(), argv[0]).parse_args(argv)
    except (PluginError, UnknownNameError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    _configure_process(args)
    try:
        return COMMANDS.get(args.command).run(args)
    except (ConfigError, UnknownNameError, FileNotFoundError, record_files.CorruptRecord, OutputError,
            PluginError) as exc:
        # DatasetNotFound (a missing dataset, or a ChecksumMismatch) included: every run would fail the same way
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:        # Ctrl-C or SIGTERM (clbench.executors.Interrupted says what is kept)
        print(str(exc) or "interrupted: finished runs are kept; rerun the same command to resume.", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


def _configure_process(args: argparse.Namespace) -> None:
    """Progress bars and data roots from the common flags. A module not imported yet holds its defaults, which the
    flags left as they are keep: it is not imported for them (tqdm and numpy would double `list`'s start time)."""
    if args.quiet or "clbench.progress" in sys.modules:
        from clbench import progress

        progress.set_enabled(not args.quiet)
    if args.data_root is not None or args.download or "clbench.data" in sys.modules:
        from clbench.data import configure

        configure(data_root=args.data_root, download=args.download)


if __name__ == "__main__":
    sys.exit(main())
