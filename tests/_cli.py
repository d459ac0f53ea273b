"""Running the command line from a test, and reading its one-line refusals."""

from __future__ import annotations

from clbench.cli import main


def run_suite(suite, out, *extra) -> int:
    """``clbench --suite SUITE --out OUT`` on the CPU, quiet, with ``extra`` flags; the exit status."""
    return main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table", "--device", "cpu", *extra])


def one_error_line(capsys, *needles) -> str:
    """The one ``error: ...`` line the command wrote to stderr (its ``suite ...`` header aside), with every needle."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("suite ")]
    assert len(err) == 1 and err[0].startswith("error: ") and len(err[0]) < 600, err
    assert all(n in err[0] for n in needles), err
    return err[0]
