"""Paired differences between two rows of a suite over their common seeds (the statistic behind a claim).

For rows ``A`` and ``B`` (strategy labels) on one scenario and a metric ``m`` (e.g. ``last_acc``)::

    d_s = m(A, seed s) − m(B, seed s)        for every finished seed s that both rows ran
    d̄ = mean_s d_s,   95% interval  d̄ ± t_{0.975, n−1} · sd(d) / √n     (Student t; none for n = 1)
    r_s = d_s / m(B, seed s)                  the relative difference (a "20% gain"), with the same interval

Pairing by seed removes what the rows share in a seed (data order, initial state), so the interval is about the
difference itself. A claim "A beats B" is shown when the interval lies above 0, contradicted when it lies below,
and not shown otherwise. Read relatively, both intervals must agree: the ``d_s`` and the ``r_s`` are the same seeds'
differences, so where one interval holds 0 and the other does not, neither is read as more than "not shown".
``run_bench.py analyze paired --run <results folder> --pairs A:B [C:D ...]`` prints the table and writes
``paired.csv`` (:mod:`clbench.commands.analyze`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from clbench import adequacy, leaderboard
from clbench.metrics import SUMMARIES


@dataclass(frozen=True)
class Paired:
    scenario: str
    a: str
    b: str
    metric: str
    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    baselines: tuple[float, ...] = ()     # m(B, seed s): the denominators of the relative differences

    @property
    def mean(self) -> float:
        return float(np.mean(self.differences))

    @property
    def half_width(self) -> float:
        """Half the 95% t interval (NaN for fewer than 2 seeds)."""
        return _half_width(self.differences)

    @property
    def relatives(self) -> tuple[float, ...]:
        """``r_s = d_s / m(B, seed s)`` (NaN where ``m(B)`` is 0)."""
        return tuple(d / b if b else float("nan") for d, b in zip(self.differences, self.baselines))

    @property
    def relative_mean(self) -> float:
        return float(np.mean(self.relatives))

    @property
    def relative_half_width(self) -> float:
        return _half_width(self.relatives)

    @property
    def verdict(self) -> str:
        """``A > B`` / ``A < B`` where the interval of ``d̄`` lies wholly above / below 0, else not shown."""
        return _side(self.mean, self.half_width)

    @property
    def relative_verdict(self) -> str:
        """The verdict of the relative reading: :attr:`verdict` where the interval of ``r̄`` lies on the same side of
        0, else not shown (the two intervals of the same differences disagree)."""
        absolute = self.verdict
        return absolute if _side(self.relative_mean, self.relative_half_width) == absolute else "not shown"


def _side(mean: float, half_width: float) -> str:
    if np.isnan(half_width):
        return "one seed: no interval"
    return "A > B" if mean - half_width > 0 else "A < B" if mean + half_width < 0 else "not shown"


def _half_width(values: tuple[float, ...]) -> float:
    """Half the 95% Student-t interval of the mean of ``values`` (NaN for fewer than 2)."""
    n = len(values)
    if n < 2:
        return float("nan")
    return float(stats.t.ppf(0.975, n - 1) * np.std(values, ddof=1) / np.sqrt(n))


def row_label(record: dict) -> str:
    strategy = record["spec"]["strategy"]
    return strategy.get("label") or strategy["name"]


def scenario_label(record: dict) -> str:
    scenario = record["spec"]["scenario"]
    return scenario.get("label") or scenario["name"]


def paired(records: list[dict], a: str, b: str, metric: str = "last_acc") -> list[Paired]:
    """One :class:`Paired` per scenario on which both rows have finished seeds in common."""
    values: dict[tuple[str, str, int], float] = {}
    for r in records:
        if r["status"] == "finished" and r["metrics"].get(metric) is not None:      # None: undefined (joint's avg_inc)
            values[(scenario_label(r), row_label(r), r["seed"])] = float(r["metrics"][metric])
    out = []
    for scenario in sorted({k[0] for k in values}):
        seeds = sorted(s for (sc, row, s) in values if sc == scenario and row == a and (sc, b, s) in values)
        if seeds:
            out.append(Paired(scenario, a, b, metric, tuple(seeds),
                              tuple(values[(scenario, a, s)] - values[(scenario, b, s)] for s in seeds),
                              tuple(values[(scenario, b, s)] for s in seeds)))
    return out


def removals(suite_dir: str | Path) -> dict[tuple[str, str, str], list[dict]]:
    """The removal records of ``run_bench.py forget`` (``<suite_dir>/removals/*.json``, one per run, request and
    mode) grouped by ``(row, request, mode)``, in file-name order."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for path in sorted((Path(suite_dir) / "removals").glob("*.json")):
        removal = json.loads(path.read_text())
        groups.setdefault((removal["strategy"], removal["request"], removal["mode"]), []).append(removal)
    return groups


def removal_change(row: str, request: str, members: list[dict]) -> Paired:
    """``accuracy after − accuracy before`` of one removal over its runs (one per seed), paired by run."""
    return Paired(request, f"{row} after", f"{row} before", "accuracy", tuple(range(len(members))),
                  tuple(m["accuracy_after"] - m["accuracy_before"] for m in members),
                  tuple(m["accuracy_before"] for m in members))


def decimals(records: list[dict], metric: str) -> int:
    """Decimals of ``metric`` (a summary column such as ``last_acc`` or ``ndcg@10_last``): those of its unit
    (:func:`clbench.leaderboard.score_decimals`), from the records' metric specs."""
    units = {spec.column(summary): spec.unit for r in records for spec in leaderboard.metric_specs(r)
             for summary in SUMMARIES}
    return leaderboard.score_decimals(units.get(metric, "%"))


def flag_kinds(records: list[dict], scenario: str, row: str, root: str | None) -> tuple[str, ...]:
    """The kinds of :mod:`clbench.adequacy` flag (``not learned``, ``not converged``) that any finished seed of
    ``row`` on ``scenario`` carries (``root``: the suite folder, for its committed training logs)."""
    members = [r for r in records if scenario_label(r) == scenario and row_label(r) == row]
    return tuple(dict.fromkeys(f.kind for r in members if r["status"] == "finished"
                               for f in adequacy.record_flags(r, root)))


__all__ = ["Paired", "decimals", "flag_kinds", "paired", "removal_change", "removals"]
