"""Training stability from recorded per-epoch curves (Ding et al., ICML 2024, Figure 4: the vanilla Transformer's
curves "suffer from high variance and/or substantial fluctuation", Re-Attention's converge "faster and smoother").

A curve is one run's value per epoch, ``x_1 .. x_E`` (a run's ``artifacts/<run_id>/training_log.jsonl``: the mean
training loss of each epoch, written for every run; or a validation curve of ``benchmarks/seqrec_games_curve.py``:
NDCG@10 after each epoch). For the curves of one row over seeds ``s = 1..S`` (all of ``E`` epochs):

- ``seed_spread = (1/E) Σ_e std_s(x_{s,e})``: the spread across seeds, averaged over epochs (sample std, ``S ≥ 2``);
- ``roughness = (1/S) Σ_s (1/(E−2)) Σ_{e=2}^{E−1} |x_{s,e+1} − 2 x_{s,e} + x_{s,e−1}|``: the mean absolute second
  difference, 0 for a curve that moves at a constant rate, large for one that zig-zags (``E ≥ 3``);
- ``reversals = (1/S) Σ_s |{e : sign(x_{s,e+1} − x_{s,e}) = −sign(x_{s,E} − x_{s,1})}| / (E − 1)``: the fraction of
  epoch-to-epoch moves against the curve's overall direction;
- ``final_spread``: ``std_s(x_{s,E})``.

:func:`row_stability` computes them for one row; :func:`training_loss_curves` reads a row's curves from a results
folder's checked records; ``run_bench.py analyze stability --run FOLDER --rows A B`` prints the table and writes
``stability.csv``.
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
    seed_spread: float
    roughness: float
    reversals: float
    final_spread: float


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def row_stability(curves: list[list[float]]) -> Stability:
    """:class:`Stability` of one row's curves ``[x_s]`` (each a list of ``E`` per-epoch values, ``S ≥ 2``,
    ``E ≥ 3``, every curve of the same length: a shorter run is another budget, refused)."""
    lengths = {len(c) for c in curves}
    if len(curves) < 2 or len(lengths) != 1 or min(lengths) < 3:
        raise ValueError(f"stability needs at least 2 curves of one length of at least 3 epochs; got lengths "
                         f"{[len(c) for c in curves]}.")
    (epochs,) = lengths
    by_epoch = list(zip(*curves))
    roughness = [statistics.fmean(abs(c[e + 1] - 2 * c[e] + c[e - 1]) for e in range(1, epochs - 1)) for c in curves]
    reversals = [sum(_sign(c[e + 1] - c[e]) == -_sign(c[-1] - c[0]) != 0 for e in range(epochs - 1)) / (epochs - 1)
                 for c in curves]
    return Stability(len(curves), epochs, statistics.fmean(statistics.stdev(v) for v in by_epoch),
                     statistics.fmean(roughness), statistics.fmean(reversals), statistics.stdev(by_epoch[-1]))


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


__all__ = ["Stability", "row_stability", "training_loss_curves"]
