"""``clbench`` (also ``python -m clbench`` and ``python run_bench.py``): the parser and the dispatch of the
sub-commands; each command is a module of :mod:`clbench.commands`.

::

    clbench --suite quick                                  # run (the default command); resumes
    clbench --suite cifar100 --strategy replay --seeds 0 1 --device cuda --amp
    clbench --plugins my_methods.py --suite my_suite.yaml  # with a strategy of your own (see clbench.plugins)
    clbench list [--markdown]                              # scenarios, strategies, models, callbacks, suites
    clbench leaderboard --out results/quick                # rebuild CSV/markdown/plots/report.md from records
    clbench report --out results/quick                     # the same; prints where report.md is

A module adds a sub-command by registering a :class:`clbench.commands.Command` in ``clbench.registry.COMMANDS``.
Only the chosen command's module is imported (and torch only by the commands that train): ``--help`` and ``list``
read the registries' index.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
import warnings
from pathlib import Path

from clbench import __version__
from clbench.errors import ConfigError, OutputError
from clbench.plugins import PluginError, load_plugin
from clbench.registry import COMMANDS, UnknownNameError


def quiet_third_party_warnings() -> None:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message="No loggers specified")
    warnings.filterwarnings("ignore", message=".*QP solver.*")
    # torch's notice about Avalanche's list indexing in its replay buffers (avalanche/training/utils.py); printed
    # again for every run (each strategy's catch_warnings resets the once-per-location registry)
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional indexing")


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
    default = (f"Without a command, {prog} runs a suite: `{prog} --suite quick` is `{prog} run --suite quick`. The "
               f"suite's flags (--suite, --strategy, --scenario, --seeds, --out, --jobs, --device, ...) are listed "
               f"by `{prog} run --help`; a command's own by `{prog} COMMAND --help`.")
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=textwrap.fill(default, 100))
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


SIGPIPE_EXIT = 128 + 13
"""The exit code of a command whose output pipe closed (``clbench list | head -1``): the shell's for SIGPIPE."""


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the command line ``argv``; its exit code. A closed output pipe ends it quietly, as other Unix tools do."""
    try:
        return _main(argv, prog)
    except BrokenPipeError:
        # what is still buffered for the closed pipe would raise again when Python flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return SIGPIPE_EXIT


def _main(argv: list[str] | None, prog: str | None) -> int:
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
    except Exception as exc:
        if not isinstance(exc, _one_line_errors()):
            raise
        # DatasetNotFound (a missing dataset, or a ChecksumMismatch) included: every run would fail the same way
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:        # Ctrl-C or SIGTERM (clbench.executors.Interrupted says what is kept)
        print(str(exc) or "interrupted: finished runs are kept; rerun the same command to resume.", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


def _one_line_errors() -> tuple[type[Exception], ...]:
    """The errors a command ends with as one ``error:`` line and exit code 2; :mod:`clbench.records`' CorruptRecord
    only where that module was imported (it imports numpy: not for a refusal before the imports, which cannot have
    read a record)."""
    records = sys.modules.get("clbench.records")
    return (ConfigError, UnknownNameError, FileNotFoundError, OutputError, PluginError,
            *((records.CorruptRecord,) if records is not None else ()))


def _configure_process(args: argparse.Namespace) -> None:
    """Progress bars and data roots from the common flags. A module not imported yet holds its defaults, which the
    flags left as they are keep: it is not imported for them (tqdm and numpy would double `list`'s start time)."""
    if args.quiet:      # third-party console output too: W&B's ~20 lines per run (inherited by worker processes)
        os.environ["WANDB_SILENT"] = "true"
    if args.quiet or "clbench.progress" in sys.modules:
        from clbench import progress

        progress.set_enabled(not args.quiet)
    if args.data_root is not None or args.download or "clbench.data" in sys.modules:
        from clbench.data import configure

        configure(data_root=args.data_root, download=args.download)


if __name__ == "__main__":
    sys.exit(main())
