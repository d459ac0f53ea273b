"""``clbench leaderboard --out results/quick``: rebuild leaderboard.csv/.md, the plots and report.md from the records
in a suite's output folder (:func:`write_tables`, also what ``run`` and ``report`` write)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from clbench import records as record_files
from clbench.commands import Command
from clbench.files import locked_folder
from clbench.registry import COMMANDS


def write_tables(out: Path):
    """Leaderboard files and plots from the valid records in ``out``; every file in ``runs/`` that is not a record
    is reported by path on stderr and skipped. Returns ``(table, corrupt files)``."""
    from clbench import leaderboard, report, suite_report

    records, corrupt = record_files.load_dir(out)
    for problem in corrupt:
        print(f"warning: {problem}; skipped", file=sys.stderr)
    table = leaderboard.write(out, records)
    suite_report.write(out, records, report.plot(records, out))
    return table, corrupt


@contextlib.contextmanager
def rebuilding(out: Path, holder: str,
               then: str = "wait for it to end: it writes its leaderboard and report itself") -> Iterator[None]:
    """Hold ``out``'s lock (:func:`clbench.files.locked_folder`) while ``leaderboard`` or ``report`` rewrites its files.
    They write the very files a suite writes when its runs end, from whatever records are there: run while a suite
    holds the folder, they would put a table of its first runs where its results go (and a suite started meanwhile
    would write the same files), so they are refused in one line naming the suite and its pid; the suite writes
    them itself when it ends. A folder without ``runs/`` is neither locked nor made: reading its records says what
    to do. ``holder``: the command, as a refusal of another writer names it; ``then``: what the refused command
    should do (``analyze paired`` reads the records too)."""
    if not (out / "runs").is_dir():
        yield
        return
    with locked_folder(out, holder, then):
        yield


def skipped_note(corrupt: list) -> str:
    """The end of the closing line when files in ``runs/`` were skipped ('' otherwise)."""
    return f"; {len(corrupt)} file(s) in runs/ skipped (see above)" if corrupt else ""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="a suite's output folder, e.g. results/quick; exit code 2 when a "
                                                "file in its runs/ is not a run record (skipped)")


def run(args: argparse.Namespace) -> int:
    """Exit code 2 when a file in ``runs/`` was not a record (the table is still written from the others); refused
    while a suite runs in ``--out`` (:func:`rebuilding`)."""
    with rebuilding(Path(args.out), "leaderboard"):
        table, corrupt = write_tables(Path(args.out))
    print((Path(args.out) / "leaderboard.md").read_text())
    print(f"{len(table)} rows -> {Path(args.out) / 'leaderboard.csv'}{skipped_note(corrupt)}", file=sys.stderr)
    return 2 if corrupt else 0


COMMANDS.register("leaderboard")(Command("rebuild leaderboard.csv/.md and plots from the records in --out",
                                         _add_arguments, run))
