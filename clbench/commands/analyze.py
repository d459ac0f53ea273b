"""``run_bench.py analyze ANALYSIS --run ...``: analyses of recorded runs.

::

    # the dual-form analysis of a run recorded with the dual_form callback (clbench.analysis.dual_form_report)
    python run_bench.py analyze dual-form --run results/<suite>/runs/<run_id>.json [--out DIR] [--queries 1000]
    # paired differences between suite rows over their common seeds (clbench.analysis.paired)
    python run_bench.py analyze paired --run results/<suite> --pairs A:B [C:D ...] [--metric last_acc]
    # training stability of suite rows from their per-epoch training losses (clbench.analysis.stability)
    python run_bench.py analyze stability --run results/<suite> --rows A B [...]
    # ... or from per-epoch validation courses (benchmarks/budget_curve.py ... --trajectory outputs)
    python run_bench.py analyze stability --curves FILE [FILE ...] --out DIR

``dual-form`` reads the run's store (``<out>/artifacts/<run_id>/dual_form/run/``), rebuilds its scenario, loads the
model saved after the last experience and writes its files to ``--out`` (default ``<out>/dual_form/<run_id>/``).
``paired`` prints the table and writes ``paired.csv`` to ``--out`` (default: the results folder); ``stability``
likewise ``stability.csv`` (one line per row and scenario; the spreads across seeds are left empty for a row of one
seed), from a results folder's records or, with ``--curves``, from every row of the budget-curve files given.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from clbench import records as record_files
from clbench.commands import Command
from clbench.commands.leaderboard import rebuilding
from clbench.errors import ConfigError
from clbench.escaping import csv_cell
from clbench.registry import COMMANDS


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("analysis", choices=sorted(ANALYSES), help="which analysis")
    p.add_argument("--run", help="dual-form: a run record (<out>/runs/<run_id>.json) recorded with dual_form; "
                                 "paired, stability: a results folder")
    p.add_argument("--out", help="output folder (dual-form: default <out>/dual_form/<run_id>; paired, stability: "
                                 "default the results folder; required with --curves)")
    p.add_argument("--queries", type=int, default=1000, help="test samples per test experience used as queries")
    p.add_argument("--examples", type=int, default=4, help="misclassified first-experience queries to plot")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--pairs", nargs="+", default=[], help="paired: rows to compare, A:B (strategy labels)")
    p.add_argument("--metric", default="last_acc", help="paired: the metric compared")
    p.add_argument("--rows", nargs="+", default=[], help="stability: the rows (strategy labels) to read")
    p.add_argument("--curves", nargs="+", default=[], help="stability: budget_curve.py --trajectory outputs to read "
                                                           "instead of a results folder (with --out)")


def _needs_run(args: argparse.Namespace) -> Path:
    if not args.run:
        raise ConfigError(f"analyze {args.analysis} needs --run (see run_bench.py analyze --help).")
    return Path(args.run)


def dual_form(args: argparse.Namespace) -> int:
    """Load the run, its pattern store, its scenario and its last model; write the report."""
    import torch

    from clbench.analysis.dual_form_report import write_report
    from clbench.analysis.store import PatternStore
    from clbench.runner import build_scenario
    from clbench.specs import RunSpec

    path = _needs_run(args)
    record = record_files.read(path)
    run_id = record["run_id"]
    folder = path.parent.parent / "artifacts" / run_id / "dual_form" / "run"
    if not (folder / "patterns" / "manifest.json").exists():
        raise ConfigError(f"{path}: no dual-form store at {folder}/patterns; run it with the dual_form callback.")
    store = PatternStore(folder / "patterns")
    spec = RunSpec.from_dict(record["spec"])
    scenario = build_scenario(spec)
    model = torch.load(folder / "models" / f"after_exp{len(scenario.train_stream) - 1}.pt", weights_only=False,
                       map_location="cpu")
    out = Path(args.out) if args.out else path.parent.parent / "dual_form" / run_id
    out.mkdir(parents=True, exist_ok=True)
    summary = write_report(record, spec, scenario, model, store, out, args.queries, args.examples, args.top_k,
                           source=str(path))
    print(json.dumps(summary, indent=1, default=float))
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")
    return 0


def paired(args: argparse.Namespace) -> int:
    """The paired differences of every ``--pairs A:B`` on every scenario, printed and written to paired.csv (the
    results folder held locked meanwhile: a suite still writing its records is refused in one line)."""
    pairs = [pair.partition(":") for pair in args.pairs]
    for pair, (a, sep, b) in zip(args.pairs, pairs):
        if not sep or not a or not b:
            raise ConfigError(f"--pairs takes A:B (two strategy labels), got {pair!r}.")
    folder = _needs_run(args)
    with rebuilding(folder, "analyze paired", "wait for it to end: its records are still being written"):
        return _paired(args, folder, pairs)


def _paired(args: argparse.Namespace, folder: Path, pairs: list[tuple[str, str, str]]) -> int:
    from clbench.analysis.paired import paired as paired_rows

    found, problems = record_files.load_dir(folder)
    for problem in problems:
        print(f"skipped: {problem}")
    rows = []
    for a, _, b in pairs:
        results = paired_rows(found, a, b, args.metric)
        if not results:
            print(f"{a} vs {b}: no seeds in common with a finished {args.metric}")
        rows += results
    header = ["scenario", "A", "B", "metric", "n_seeds", "mean_A_minus_B", "ci95_half_width", "verdict",
              "relative_mean", "relative_ci95_half_width", "relative_verdict", "per_seed"]
    table = [[p.scenario, p.a, p.b, p.metric, len(p.seeds), _g(p.mean), _g(p.half_width), p.verdict,
              _g(p.relative_mean), _g(p.relative_half_width), p.relative_verdict,
              " ".join(f"{d:+.3g}" for d in p.differences)] for p in rows]
    out = Path(args.out) if args.out else folder
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "paired.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, *([*map(csv_cell, row[:LABELS]), *row[LABELS:]] for row in table)])
    print(" | ".join(header))
    for row in table:
        print(" | ".join(str(v) for v in row))
    return 0


def stability(args: argparse.Namespace) -> int:
    """The stability statistics (:mod:`clbench.analysis.stability`) of every ``--rows`` label on every scenario it
    ran on (the results folder held locked meanwhile), or of every row of the ``--curves`` files, printed and
    written to stability.csv."""
    if args.curves:
        if args.run or args.rows or not args.out:
            raise ConfigError("analyze stability --curves FILE [...] reads every row of those files: give --out DIR, "
                              "not --run or --rows.")
        from clbench.analysis.stability import validation_curves
        try:
            curves = validation_curves(args.curves)
        except (OSError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        return _write_stability(curves, Path(args.out))
    folder = _needs_run(args)
    if not args.rows:
        raise ConfigError("analyze stability needs --rows A [B ...] (strategy labels).")
    with rebuilding(folder, "analyze stability", "wait for it to end: its records are still being written"):
        return _write_stability(_recorded_curves(args.rows, folder), Path(args.out) if args.out else folder)


def _recorded_curves(rows: list[str], folder: Path) -> dict[tuple[str, str], list[list[float]]]:
    from clbench.analysis.paired import row_label, scenario_label
    from clbench.analysis.stability import training_loss_curves

    found, problems = record_files.load_dir(folder)
    for problem in problems:
        print(f"skipped: {problem}")
    curves = {}
    for label in rows:
        scenarios = sorted({scenario_label(r) for r in found if row_label(r) == label})
        if not scenarios:
            raise ConfigError(f"{folder}: no record of row {label!r}; its rows: "
                              f"{', '.join(sorted({row_label(r) for r in found}))}.")
        for scenario in scenarios:
            curves[scenario, label] = training_loss_curves(found, folder, label, scenario)
    return curves


def _write_stability(curves: dict[tuple[str, str], list[list[float]]], out: Path) -> int:
    from clbench.analysis.stability import row_stability

    header = ["scenario", "row", "seeds", "epochs", "seed_spread", "roughness", "reversals", "final_spread"]
    table = []
    for (scenario, label), row_curves in curves.items():
        try:
            s = row_stability(row_curves)
        except ValueError as exc:
            raise ConfigError(f"row {label!r} on {scenario!r}: {exc}") from None
        table.append([scenario, label, s.seeds, s.epochs, _g(s.seed_spread), _g(s.roughness), _g(s.reversals),
                      _g(s.final_spread)])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "stability.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, *([*map(csv_cell, row[:2]), *row[2:]] for row in table)])
    print(" | ".join(header))
    for row in table:
        print(" | ".join(str(v) for v in row))
    return 0


LABELS = 4
"""paired.csv's columns copied from labels given by the user (scenario, A, B, metric): written through
:func:`clbench.escaping.csv_cell` (a label cannot be a spreadsheet formula); the numbers are written as they are."""


def _g(x: float | None) -> str:
    """Three significant digits: metrics range from accuracies in percent to NDCG@10 near 0.01; empty for None (a
    spread across seeds of one seed)."""
    return "" if x is None else f"{x:.3g}"


ANALYSES = {"dual-form": dual_form, "paired": paired, "stability": stability}


def run(args: argparse.Namespace) -> int:
    return ANALYSES[args.analysis](args)


COMMANDS.register("analyze")(Command("analyses of recorded runs (dual-form: attention over training patterns; "
                                     "paired: paired differences between suite rows over seeds; stability: spread "
                                     "and roughness of per-epoch training losses or validation courses)",
                                     _add_arguments, run))
