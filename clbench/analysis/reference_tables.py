"""results/REFERENCE.md's tables, generated from the committed records, so that no section can go stale.

A generated table sits between two marker comments; everything outside them is hand-written prose::

    <!-- generated: suite=der table=leaderboard -->
    | suite | scenario | ... |
    <!-- end generated -->

The opening marker names the records (``suite``: the folder ``<root>/<suite>/runs``) and the table kind (a
:data:`TABLES` entry), with the kind's own ``key=value`` options:

- ``leaderboard``: :func:`clbench.leaderboard.to_markdown` of the records, as ``run_bench.py leaderboard`` writes
  it; ``scenario=<label>`` keeps one scenario.
- ``paired``: :func:`clbench.analysis.paired.paired` for ``pairs=A:B,C:D`` (strategy labels) on ``metric=<name>``
  (default ``last_acc``): per pair and scenario, the seeds, ``d̄ ± t·sd/√n`` (with the metric's decimals) and
  the verdict; with ``relative=yes`` also ``r̄ ± half-width`` of ``r_s = d_s / m(B, s)`` in percent, and the
  verdict only where both intervals agree (:attr:`clbench.analysis.paired.Paired.relative_verdict`). A pair
  one of whose rows is flagged by :mod:`clbench.adequacy` (``not learned``, ``not converged``) has its verdict
  marked ``(flagged: <row> <flag>; ...)``: not evidence (tests/test_analysis_claims.py fails on a claim that cites it
  without saying so).
- ``diag``: per scenario and row, ``diag = mean_i R[i, i]`` (accuracy on each step just after training it;
  mean ± sample std over seeds) beside ``last_acc``, and ``R[i, i]`` step by step: how well each step is learned,
  and whether a row learned its new classes at all.
- ``claims`` (no ``suite=``): the claims table, computed from ``results/claims.yaml`` and every suite's records
  (:func:`clbench.analysis.claims.claims_markdown`).
- ``removals``: the suite's removal records (``run_bench.py forget``, ``<suite>/removals/*.json``): per row,
  request and mode, the accuracy before and after removing shards and the paired change with its 95% half-width.

:func:`regenerate` rewrites every block from the records; :func:`stale_blocks` lists the blocks whose committed
text differs from what the records give (tests/test_analysis_reference_tables.py fails on any).
``python -m clbench.analysis.reference_tables [--check] [results/REFERENCE.md]`` does either from a shell.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from clbench import leaderboard
from clbench import records as record_files
from clbench.analysis.claims import claims_markdown
from clbench.analysis.paired import decimals, flag_kinds, paired, removal_change, removals, row_label, scenario_label

BLOCK = re.compile(r"(<!-- generated: (?P<options>[^>]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
REFERENCE = Path(__file__).resolve().parents[2] / "results" / "REFERENCE.md"


def _options(text: str) -> dict[str, str]:
    """``key=value`` pairs of an opening marker; ``table`` is required, and ``suite`` for a table made from one
    suite's records (every kind but those of :data:`WHOLE_ROOT`)."""
    options = dict(item.split("=", 1) for item in text.split())
    if options.get("table") not in {*TABLES, *WHOLE_ROOT}:
        raise ValueError(f"generated block '{text}': unknown table {options.get('table')!r}; one of "
                         f"{sorted({*TABLES, *WHOLE_ROOT})}.")
    if options["table"] in TABLES and "suite" not in options:
        raise ValueError(f"generated block '{text}' lacks ['suite']; write e.g. "
                         f"'<!-- generated: suite=der table=leaderboard -->'.")
    return options


def _records(root: Path, suite: str, scenario: str | None = None) -> list[dict]:
    found, problems = record_files.load_dir(root / suite)
    if problems or not found:
        raise ValueError(f"{root / suite / 'runs'}: {len(found)} records, problems: {[str(p) for p in problems]}")
    return [r for r in found if scenario is None or scenario_label(r) == scenario]


def _suite_root(options: dict[str, str]) -> str | None:
    """The folder of the block's records (``<root>/<suite>``: committed training logs for the adequacy flags)."""
    return str(Path(options["root"]) / options["suite"]) if "root" in options else None


def leaderboard_table(records: list[dict], options: dict[str, str]) -> str:
    return leaderboard.to_markdown(leaderboard.build(records, _suite_root(options)))


FLAGGED = "flagged:"
"""What a paired verdict says before the flags of its rows (:func:`paired_mark`)."""


def paired_mark(records: list[dict], scenario: str, rows: tuple[str, ...], root: str | None) -> str:
    """`` (flagged: <row> <flags>; ...)`` for the rows of a pair on ``scenario`` that :mod:`clbench.adequacy`
    flags (their flag kinds, without counts), else ``""``."""
    marks = [f"{row} {', '.join(kinds)}" for row in rows if (kinds := flag_kinds(records, scenario, row, root))]
    return f" ({FLAGGED} {'; '.join(marks)})" if marks else ""


def paired_table(records: list[dict], options: dict[str, str]) -> str:
    metric = options.get("metric", "last_acc")
    relative = options.get("relative") == "yes"
    digits = decimals(records, metric)
    header = ["scenario", "A − B", "metric", "seeds", "mean ± 95% half-width", *(["relative"] if relative else []),
              "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for pair in options["pairs"].split(","):
        a, b = pair.split(":")
        results = paired(records, a, b, metric)
        if not results:
            raise ValueError(f"paired {a}:{b} on {metric}: no seeds in common")
        for p in results:
            cells = [p.scenario, f"{a} − {b}", metric, str(len(p.seeds)),
                     f"{p.mean:+.{digits}f} ± {p.half_width:.{digits}f}",
                     *([f"{100 * p.relative_mean:+.1f}% ± {100 * p.relative_half_width:.1f}"] if relative else []),
                     (p.relative_verdict if relative else p.verdict)
                     + paired_mark(records, p.scenario, (a, b), _suite_root(options))]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def diag_table(records: list[dict], options: dict[str, str]) -> str:
    """Per (scenario, row): seeds, ``last_acc``, ``diag = mean_i R[i, i]`` (percent; mean ± std over seeds) and
    ``R[i, i]`` step by step (mean over seeds), sorted by diag, best first."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r["status"] == "finished":
            groups.setdefault((scenario_label(r), row_label(r)), []).append(r)

    def pm(values: list[float]) -> str:
        return f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f}" if len(values) > 1 else f"{values[0]:.2f} (n=1)"

    rows = []
    for (scenario, row), members in groups.items():
        diagonals = np.array([100 * np.diag(np.asarray(r["accuracy_matrix"])) for r in members])   # (seeds, T)
        last = [float(r["metrics"]["last_acc"]) for r in members]
        steps = " / ".join(f"{v:.1f}" for v in diagonals.mean(axis=0))
        rows.append((scenario, -float(diagonals.mean()), row, len(members), pm(last),
                     pm(list(diagonals.mean(axis=1))), steps))
    lines = ["| scenario | row | seeds | last_acc | diag | R[i, i] at steps 1, 2, ... (mean over seeds) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {s} | {row} | {n} | {last} | {diag} | {steps} |" for s, _, row, n, last, diag, steps in sorted(rows)]
    return "\n".join(lines) + "\n"


def removals_table(records: list[dict], options: dict[str, str]) -> str:
    """The removal records of ``run_bench.py forget`` (``<suite>/removals/*.json``, one per run, request and mode),
    per (row, request, mode): seeds, shards left, accuracy before and after (mean) and the paired change
    ``after − before`` with its 95% half-width over the seeds."""
    groups = removals(Path(options["root"]) / options["suite"])
    if not groups:
        raise ValueError(f"{Path(options['root']) / options['suite'] / 'removals'}: no removal records")
    lines = ["| row | request | mode | seeds | shards left | accuracy before | after | after − before |",
             "|---|---|---|---|---|---|---|---|"]
    for (row, request, mode), members in sorted(groups.items()):
        change = removal_change(row, request, members)
        left = sorted({m["shards_left"] for m in members})
        lines.append(f"| {row} | {request} | {mode} | {len(members)} | {', '.join(map(str, left))} | "
                     f"{np.mean([m['accuracy_before'] for m in members]):.2f} | "
                     f"{np.mean([m['accuracy_after'] for m in members]):.2f} | "
                     f"{change.mean:+.2f} ± {change.half_width:.2f} |")
    return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[list[dict], dict[str, str]], str]] = {
    "leaderboard": leaderboard_table, "paired": paired_table, "diag": diag_table, "removals": removals_table}
"""Table kinds a generated block may name: ``(records, marker options) -> markdown``."""

WHOLE_ROOT: dict[str, Callable[[Path], str]] = {"claims": claims_markdown}
"""Table kinds made from every suite under the results root (no ``suite=``): ``(root) -> markdown``; ``claims`` is
the claims table of ``results/claims.yaml`` (:mod:`clbench.analysis.claims`)."""


def render(options: dict[str, str], root: Path) -> str:
    """The markdown of one block: its table kind on the records of its suite (and scenario), or on the whole root."""
    if options["table"] in WHOLE_ROOT:
        return WHOLE_ROOT[options["table"]](root)
    return TABLES[options["table"]](_records(root, options["suite"], options.get("scenario")),
                                    {**options, "root": str(root)})


def regenerate(text: str, root: Path) -> str:
    """``text`` with every generated block's body rewritten from the records under ``root``."""
    return BLOCK.sub(lambda m: m.group(1) + render(_options(m.group("options")), root) + m.group(4), text)


def stale_blocks(text: str, root: Path) -> list[str]:
    """The opening markers of the blocks whose committed body differs from what the records give."""
    return [m.group("options") for m in BLOCK.finditer(text)
            if m.group("body") != render(_options(m.group("options")), root)]


__all__ = ["TABLES", "main", "regenerate", "render", "stale_blocks"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clbench.analysis.reference_tables",
                                     description="Regenerate (or --check) the generated tables of REFERENCE.md.")
    parser.add_argument("path", nargs="?", default=str(REFERENCE), help="the markdown file (default: %(default)s)")
    parser.add_argument("--root", default=str(REFERENCE.parent / "reference"),
                        help="folder of the suites' records (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only list stale blocks; exit 1 if any")
    args = parser.parse_args(argv)
    path = Path(args.path)
    root = Path(args.root)
    text = path.read_text()
    if args.check:
        stale = stale_blocks(text, root)
        for options in stale:
            print(f"stale: <!-- generated: {options} -->")
        return 1 if stale else 0
    path.write_text(regenerate(text, root))
    return 0


if __name__ == "__main__":
    sys.exit(main())

