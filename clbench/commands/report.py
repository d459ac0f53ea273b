"""``clbench report --out results/quick``: report.md (with the leaderboard files and plots it shows) from the
records in a suite's output folder; prints where it is."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clbench.commands import Command
from clbench.commands.leaderboard import skipped_note, write_tables
from clbench.registry import COMMANDS


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="a suite's output folder, e.g. results/quick")


def run(args: argparse.Namespace) -> int:
    """Exit code 2 as for ``leaderboard``: a file in ``runs/`` was not a record."""
    _, corrupt = write_tables(Path(args.out))
    print(f"report: {Path(args.out) / 'report.md'}{skipped_note(corrupt)}", file=sys.stderr)
    return 2 if corrupt else 0


COMMANDS.register("report")(Command(
    "write report.md (leaderboard, plots, per-scenario summary, machine and code) from the records in --out",
    _add_arguments, run))
