"""Training stability from recorded per-epoch curves (Ding et al., ICML 2024, Figure 4: the vanilla Transformer's
curves "suffer from high variance and/or substantial fluctuation", Re-Attention's converge "faster and smoother").

A curve is one run's value per epoch, ``x_1 .. x_E``: a run's ``artifacts/<run_id>/training_log.jsonl`` (the mean
training loss of each epoch, written for every run), or the validation score after each epoch of one run, as
``benchmarks/budget_curve.py ... --epochs E --trajectory`` prints it (the primary metric on the validation holdout,
the test data unread). For the curves of one row over seeds ``s = 1..S`` (all of ``E`` epochs):

- ``seed_spread = (1/E) Σ_e std_s(x_{s,e})``: the spread across seeds, averaged over epochs (sample std; None for
  one seed);
- ``roughness = (1/S) Σ_s (1/(E−2)) Σ_{e=2}^{E−1} |x_{s,e+1} − 2 x_{s,e} + x_{s,e−1}|``: the mean absolute second
  difference, 0 for a curve that moves at a constant rate, large for one that zig-zags (``E ≥ 3``);
- ``reversals = (1/S) Σ_s |{e : sign(x_{s,e+1} − x_{s,e}) = −sign(x_{s,E} − x_{s,1})}| / (E − 1)``: the fraction of
  epoch-to-epoch moves against the curve's overall direction;
- ``final_spread``: ``std_s(x_{s,E})`` (None for one seed).

:func:`row_stability` computes them for one row; :func:`training_loss_curves` reads a row's curves from a results
folder's checked records, :func:`validation_curves` every row's from budget-curve outputs;
``run_bench.py analyze stability --run FOLDER --rows A B`` or ``--curves FILE [FILE ...]`` prints the table and
writes ``stability.csv``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stability:
    """The statistics of the module docstring for one row, over ``seeds`` curves of ``epochs`` epochs."""

    seeds: int
    epochs: int
    seed_spread: float | None
    roughness: float
    reversals: float
    final_spread: float | None


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def row_stability(curves: list[list[float]]) -> Stability:
    """:class:`Stability` of one row's curves ``[x_s]`` (each a list of ``E`` per-epoch values, ``S ≥ 1``,
    ``E ≥ 3``, every curve of the same length: a shorter run is another budget, refused); the spreads across seeds
    are None for one curve."""
    lengths = {len(c) for c in curves}
    if not curves or len(lengths) != 1 or min(lengths) < 3:
        raise ValueError(f"stability needs curves of one length of at least 3 epochs; got lengths "
                         f"{[len(c) for c in curves]}.")
    (epochs,) = lengths
    by_epoch = list(zip(*curves))
    roughness = [statistics.fmean(abs(c[e + 1] - 2 * c[e] + c[e - 1]) for e in range(1, epochs - 1)) for c in curves]
    reversals = [sum(_sign(c[e + 1] - c[e]) == -_sign(c[-1] - c[0]) != 0 for e in range(epochs - 1)) / (epochs - 1)
                 for c in curves]
    several = len(curves) > 1
    return Stability(len(curves), epochs, statistics.fmean(statistics.stdev(v) for v in by_epoch) if several else None,
                     statistics.fmean(roughness), statistics.fmean(reversals),
                     statistics.stdev(by_epoch[-1]) if several else None)


def training_loss_curves(records: list[dict], folder: str | Path, label: str, scenario: str) -> list[list[float]]:
    """The per-epoch training losses of row ``label`` on scenario ``scenario``, one curve per finished seed in seed
    order: ``<folder>/artifacts/<run_id>/training_log.jsonl`` of each record in ``records`` (records already checked
    on read, :func:`clbench.records.load_dir`: a log whose record was refused or replaced is not read), its lines in
    epoch order (one experience; a log of several experiences or members is refused: their epochs are not one
    curve)."""
    from clbench.analysis.paired import row_label, scenario_label

    runs = sorted((r["seed"], r["run_id"]) for r in records
                  if r["status"] == "finished" and row_label(r) == label and scenario_label(r) == scenario)
    if not runs:
        raise FileNotFoundError(f"no finished run of row {label!r} on scenario {scenario!r} in {folder}.")
    curves = []
    for _, run_id in runs:
        log = Path(folder, "artifacts", run_id, "training_log.jsonl")
        if not log.is_file():
            raise FileNotFoundError(f"{log}: missing (its record {run_id} is in {folder}/runs).")
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        if {(r["experience"], r["member"]) for r in rows} != {(0, "")} or \
                [r["epoch"] for r in rows] != list(range(len(rows))):
            raise ValueError(f"{log}: not one experience's epochs 0..E-1 in order.")
        curves.append([float(r["loss"]) for r in rows])
    return curves


def validation_curves(paths: list[str | Path]) -> dict[tuple[str, str], list[list[float]]]:
    """Every ``(scenario, row)``'s validation curves in the outputs of ``benchmarks/budget_curve.py --trajectory``
    (``paths``: files of its JSON lines; other lines, such as its table or a ``#`` header, are not read), one curve
    per seed in seed order: ``just_trained`` at epochs ``1..E`` of step 0. Refused: a file with no such line, a JSON
    line that does not parse (a cut or edited file), a line written without ``--trajectory`` (its points may be
    separate budgets' runs, ``--at``: not one run's course) or of a later step (a step's epochs after another's are
    not one curve), a seed read twice, epochs not ``1..E`` in order (an interrupted run), or one row read in two
    metrics."""
    points: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    metrics: dict[tuple[str, str], set[str]] = {}
    for path in paths:
        found = set()
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.startswith("{"):
                continue
            where = f"{path}:{number}"
            try:
                point = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not a JSON line ({exc.msg}): a cut or edited file; rerun the curve.") \
                    from None
            if point.get("event") != "epoch":
                continue
            if point.get("trajectory") is not True:
                raise ValueError(f"{where}: not a trajectory (budget_curve.py ... --epochs E --trajectory): points "
                                 f"of separate budgets are not one run's course.")
            if point["step"] != 0:
                raise ValueError(f"{where}: step {point['step']}: a validation course is read on a one-step run.")
            key = (point["scenario"], point["row"], point["seed"])
            if key not in found and key in points:
                raise ValueError(f"{where}: seed {key[2]} of row {key[1]!r} on {key[0]!r} is also in another file.")
            found.add(key)
            points.setdefault(key, []).append((point["epoch"], float(point["just_trained"])))
            metrics.setdefault(key[:2], set()).add(point["metric"])
        if not found:
            raise ValueError(f"{path}: no epoch line of budget_curve.py in it.")
    for (scenario, row), names in metrics.items():
        if len(names) > 1:
            raise ValueError(f"row {row!r} on {scenario!r} is read in several metrics: {sorted(names)}.")
    curves: dict[tuple[str, str], list[list[float]]] = {}
    for (scenario, row, seed), course in sorted(points.items()):
        if [epoch for epoch, _ in course] != list(range(1, len(course) + 1)):
            raise ValueError(f"seed {seed} of row {row!r} on {scenario!r}: epochs {[e for e, _ in course]}, not "
                             f"1..E in order (an interrupted run?).")
        curves.setdefault((scenario, row), []).append([value for _, value in course])
    return curves


__all__ = ["Stability", "row_stability", "training_loss_curves", "validation_curves"]
