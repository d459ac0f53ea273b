"""``clbench report --out results/quick [--html]``: report.md (with the leaderboard files and plots it shows) from the
records in a suite's output folder, and with ``--html`` the self-contained page report.html
(:mod:`clbench.html_report`); prints where they are."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clbench.commands import Command
from clbench.commands.leaderboard import rebuilding, skipped_note, write_tables
from clbench.registry import COMMANDS


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="a suite's output folder, e.g. results/quick")
    p.add_argument("--html", action="store_true",
                   help="also write report.html: one self-contained page (sortable leaderboard, per-seed values and "
                        "paired intervals, score matrices and curves) to open in any browser, offline")


def run(args: argparse.Namespace) -> int:
    """Exit code 2 as for ``leaderboard``: a file in ``runs/`` was not a record. Refused while a suite runs in
    ``--out``, as ``leaderboard`` is (:func:`~clbench.commands.leaderboard.rebuilding`)."""
    with rebuilding(Path(args.out), "report"):
        _, corrupt = write_tables(Path(args.out))
        print(f"report: {Path(args.out) / 'report.md'}{skipped_note(corrupt)}", file=sys.stderr)
        if args.html:
            from clbench.html_report import write_html

            print(f"report: {write_html(Path(args.out))}", file=sys.stderr)
    return 2 if corrupt else 0


COMMANDS.register("report")(Command(
    "write report.md (leaderboard, plots, per-scenario summary, machine and code) from the records in --out",
    _add_arguments, run))
