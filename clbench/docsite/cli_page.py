"""The command-line reference: the help of ``clbench`` and of each sub-command, as the parser prints it."""

from __future__ import annotations

import contextlib
import io
import os

from clbench.cli import main
from clbench.registry import COMMANDS

WIDTH = "100"


def help_text(argv: list[str]) -> str:
    """What ``clbench ARGV --help`` prints."""
    out = io.StringIO()
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH                      # argparse wraps to the terminal width
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*argv, "--help"], prog="clbench")
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return out.getvalue().rstrip()


def page() -> str:
    parts = ["# Command line", "",
             "Generated from the parser of `clbench` (also `python -m clbench` and `python run_bench.py`). Without a "
             "command, `clbench` runs a suite: `clbench --suite quick` is `clbench run --suite quick`.", "",
             "```text", help_text([]), "```", ""]
    for name in COMMANDS.names():
        parts += [f"## `clbench {name}`", "", COMMANDS.describe(name), "", "```text", help_text([name]), "```", ""]
    return "\n".join(parts)
