"""Plots of a suite's records: score-vs-step curves, score-matrix heatmaps and parameters-vs-step.

Every score matrix of a record is plotted: ``matrices: {metric: R}`` described by ``metric_specs``, or, in records
made before those existed, ``accuracy_matrix`` as the primary metric ``accuracy`` (%). Steps are numbered
``1..T`` everywhere: step ``i`` is "after training on experience ``i``", row ``i`` of a heatmap, tick ``i`` of a
curve. Files go to ``<out_dir>/plots/``:

- ``<scenario>__<metric>.png``: per strategy, the test-size-weighted mean of row ``i`` over the experiences seen
  so far (``A_i``, :func:`clbench.metrics.seen_accuracy`), mean over seeds with a ``± 1 std`` band. An offline
  (joint) run, evaluated once after training on everything, is a single point at the last step. More than
  ``MAX_LINES_PER_PANEL`` strategies are split into panels ranked by their final value.
- ``<scenario>__<strategy>__<metric>__matrix.png``: the seed-mean ``R[i, j]`` with each cell's value; in
  class-incremental scenarios the cells ``j > i`` (classes not seen yet) are masked.
- ``<scenario>__params.png``: total parameters per step, only when some strategy's total changes between steps.

Failed records are ignored. :func:`figures` yields the figures (for inspection); :func:`plot` writes them and
removes the PNG files of ``plots/`` it did not write (plots of rows, scenarios or metrics no longer in the records),
so the folder always shows exactly the records it was drawn from. It also draws each run's training curve
(:func:`training_curves`) where it is missing, so a folder whose per-run plots were not kept (the committed
reference folders keep only their logs) gets them back from ``training_log.jsonl``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from clbench import artifacts, files  # noqa: E402
from clbench.leaderboard import metric_specs, row_labels  # noqa: E402
from clbench.metrics import MetricSpec, seen_accuracy  # noqa: E402

MAX_LINES_PER_PANEL = 10      # one colour each (tab10) within a panel
MAX_TICKS = 20                # step ticks on an axis; longer streams tick every k-th step
MAX_ANNOTATED = 20            # heatmaps with more experiences than this show colours only
_COLORS = plt.get_cmap("tab10").colors
_LINESTYLES = ("-", "--", ":")        # 10 colours x 3 styles: 30 distinct (colour, style) pairs, 7 markers on top
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def unit_text(metric: MetricSpec) -> str:
    """`` (unit)``, or nothing for a unitless metric."""
    return f" ({metric.unit})" if metric.unit else ""


def decimals(metric: MetricSpec) -> int:
    """Decimals of a value shown in a cell: 1 for percentages, 3 for fractions and other units."""
    return 1 if metric.unit == "%" else 3


@dataclass(frozen=True)
class Series:
    """One line of a figure: ``values[seed, k]`` at step ``steps[k]`` (1-based), in stored units."""

    label: str
    steps: np.ndarray
    values: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        return self.values.mean(axis=0)

    @property
    def std(self) -> np.ndarray | None:
        """Sample std over seeds (as the leaderboard's), ``None`` for a single seed."""
        return self.values.std(axis=0, ddof=1) if len(self.values) > 1 else None


# ------------------------------------------------------------------------------------------------------ records
def _group(records: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """Finished records by scenario, then strategy, under the leaderboard's row labels (so records of different
    identities are never averaged together), strategies sorted by label."""
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r, (scenario, strategy) in zip(records, row_labels(records)):
        if r["status"] == "finished":
            groups[scenario][strategy].append(r)
    return {scenario: dict(sorted(by_strategy.items())) for scenario, by_strategy in groups.items()}


def scores(record: dict) -> dict[str, tuple[MetricSpec, np.ndarray]]:
    """Every score matrix of a record with its metric, the primary metric first."""
    matrices = record.get("matrices") or {"accuracy": record["accuracy_matrix"]}
    specs = {spec.name: spec for spec in metric_specs(record)}
    out = {name: (specs.get(name, MetricSpec(name)), np.asarray(R, dtype=np.float64)) for name, R in matrices.items()}
    return dict(sorted(out.items(), key=lambda item: not item[1][0].primary))


def _metrics(runs: list[dict]) -> dict[str, MetricSpec]:
    """The metrics of a scenario's records, in first-seen order (primary first within each record)."""
    found: dict[str, MetricSpec] = {}
    for r in runs:
        for name, (metric, _) in scores(r).items():
            found.setdefault(name, metric)
    return found


def _is_offline(R: np.ndarray) -> bool:
    """An offline (joint) run has one row, evaluated after training on all ``T > 1`` experiences."""
    return R.shape[0] == 1 and R.shape[1] > 1


def _masks_unseen(record: dict, R: np.ndarray) -> bool:
    """Cells ``j > i`` mean nothing (classes not seen yet) in class-incremental continual runs only."""
    info = record.get("scenario_info") or {}
    return not (_is_offline(R) or info.get("task_aware") or info.get("domain_incremental"))


def _seen_curve(R: np.ndarray, test_sizes: list[int] | None) -> tuple[np.ndarray, np.ndarray]:
    """Steps (1-based) and each row's test-size-weighted mean over the experiences seen at that row; an offline
    run's single row covers every experience and is placed at the last step."""
    T = R.shape[1]
    sizes = test_sizes or [1] * T
    if _is_offline(R):
        return np.array([T]), np.array([seen_accuracy(R, sizes, 0, T - 1)])
    return np.arange(1, T + 1), np.array([seen_accuracy(R, sizes, i) for i in range(R.shape[0])])


def _matrices(runs: list[dict], metric: str) -> list[tuple[dict, np.ndarray]]:
    """``(record, R)`` for the runs that have a matrix for ``metric``."""
    return [(r, found[metric][1]) for r in runs if metric in (found := scores(r))]


def _score_series(label: str, runs: list[dict], metric: str) -> Series | None:
    pairs = _matrices(runs, metric)
    if not pairs:
        return None
    curves = [_seen_curve(R, r.get("test_sizes")) for r, R in pairs]
    label = f"{label} (offline)" if _is_offline(pairs[0][1]) else label
    return Series(label, curves[0][0], np.array([values for _, values in curves]))


def _params_series(label: str, runs: list[dict]) -> Series | None:
    """Total parameters per step of a continual strategy; ``None`` for offline runs (one entry)."""
    totals = np.array([[p["total"] for p in r["params_per_step"]] for r in runs], dtype=np.float64)
    return Series(label, np.arange(1, totals.shape[1] + 1), totals) if totals.shape[1] > 1 else None


def _spread_text(series: list[Series]) -> str:
    """What a line and its band are, with the number of seeds (a range when strategies differ)."""
    counts = sorted({len(s.values) for s in series})
    if counts == [1]:
        return "1 seed: no spread shown"
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"line: mean over {n} seeds; band (bar for single points): ± 1 std (sample) over seeds"


# ------------------------------------------------------------------------------------------------------ curves
def _style(k: int) -> dict:
    return {"color": _COLORS[k % len(_COLORS)], "linestyle": _LINESTYLES[k % len(_LINESTYLES)],
            "marker": _MARKERS[k % len(_MARKERS)]}


def step_ticks(T: int) -> np.ndarray:
    """Integer steps ``1..T`` to tick, every k-th one when there are more than ``MAX_TICKS``."""
    return np.arange(1, T + 1, max(1, math.ceil(T / MAX_TICKS)))


def _panels(series: list[Series], descending: bool) -> list[list[Series]]:
    """Series ranked by final mean value, split into balanced panels of at most ``MAX_LINES_PER_PANEL``."""
    ranked = sorted(series, key=lambda s: s.mean[-1], reverse=descending)
    n_panels = math.ceil(len(ranked) / MAX_LINES_PER_PANEL)
    size = math.ceil(len(ranked) / n_panels)
    return [ranked[k:k + size] for k in range(0, len(ranked), size)]


def _draw(ax, series: Series, k: int, scale: float, show_n: bool) -> None:
    style = _style(k)
    mean, std = series.mean * scale, series.std
    label = f"{series.label} (n={len(series.values)})" if show_n else series.label
    ax.plot(series.steps, mean, label=label, markersize=6, markerfacecolor="none", linewidth=1.4, **style)
    if std is not None and len(series.steps) > 1:
        ax.fill_between(series.steps, mean - std * scale, mean + std * scale, color=style["color"], alpha=0.15,
                        linewidth=0)
    elif std is not None:
        ax.errorbar(series.steps, mean, yerr=std * scale, color=style["color"], capsize=3, linestyle="none")


def _log_axis(ax) -> None:
    """A log y axis ticked at 1, 2, 5 x 10^k with plain numbers (0.05, 0.1, 0.2, ...)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def lines_figure(series: list[Series], title: str, ylabel: str, scale: float = 1.0, descending: bool = True,
                 log: bool = False) -> Figure:
    """Mean-over-seeds lines with ``± 1 std`` bands (hollow markers, so that coinciding points stay visible),
    ranked panels sharing both axes, legends outside the axes; a log y axis when ``log``."""
    panels = _panels(series, descending)
    T = max(int(s.steps[-1]) for s in series)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 0.6 + 3.0 * len(panels)), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")
    show_n = len({len(s.values) for s in series}) > 1
    start = 1
    for ax, panel in zip(axes[:, 0], panels):
        for k, s in enumerate(panel):
            _draw(ax, s, k, scale, show_n)
        ax.set_ylabel(ylabel)
        if log:
            _log_axis(ax)
        ax.grid(alpha=0.3)
        ranks = f"ranks {start}–{start + len(panel) - 1} (last step)" if len(panels) > 1 else None
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False, title=ranks,
                  title_fontsize=7)
        start += len(panel)
    ax.set_xticks(step_ticks(T))
    ax.set_xlim(0.7, T + 0.3)
    ax.set_xlabel("training step i (after experience i)")
    fig.suptitle(f"{title}\n{_spread_text(series)}", fontsize=9)
    return fig


def _score_curves(scenario: str, metric: MetricSpec, by_strategy: dict[str, list[dict]]) -> Figure:
    series = [s for label, runs in by_strategy.items() if (s := _score_series(label, runs, metric.name))]
    return lines_figure(series, f"{scenario}: {metric.name} on the experiences seen so far{unit_text(metric)}",
                        f"{metric.name}{unit_text(metric)}, seen experiences", metric.scale, metric.higher_is_better)


def _params_curves(scenario: str, series: list[Series]) -> Figure:
    """Parameters in M (K for models under a million), on a log axis when the sizes span more than 10x."""
    totals = np.concatenate([s.values.ravel() for s in series])
    top, bottom = totals.max(), totals.min()
    scale, unit = (1e-6, "M") if top >= 1e6 else (1e-3, "K")
    log = top > 10 * bottom
    return lines_figure(series, f"{scenario}: total parameters per step ({unit})",
                        f"parameters ({unit}{', log scale' if log else ''})", scale, log=log)


# ---------------------------------------------------------------------------------------------------- heatmaps
def heatmap_data(R: np.ndarray, mask_unseen: bool) -> np.ma.MaskedArray:
    """``R`` as drawn: cells ``j > i`` masked (not drawn) when ``mask_unseen``."""
    return np.ma.masked_array(R, mask=np.triu(np.ones(R.shape, dtype=bool), k=1) & mask_unseen)


def _norm(values: np.ndarray, scale: float) -> Normalize:
    """The full ``[0, 1]`` range (scaled) for fractions, the data's range otherwise."""
    if values.min() >= 0 and values.max() <= 1:
        return Normalize(0.0, scale)
    return Normalize(values.min() * scale, values.max() * scale)


def _annotate(ax, data: np.ma.MaskedArray, image, places: int) -> None:
    """Each drawn cell's value, black on light cells and white on dark ones."""
    for (i, j), value in np.ndenumerate(data.filled(np.nan)):
        if np.isnan(value):
            continue
        r, g, b, _ = image.cmap(image.norm(value))
        colour = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
        ax.text(j, i, f"{value:.{places}f}", ha="center", va="center", fontsize=8, color=colour)


def heatmap_figure(title: str, R: np.ndarray, metric: MetricSpec, mask_unseen: bool) -> Figure:
    """The seed-mean score matrix ``R`` (stored fractions) with each cell's value in the metric's unit."""
    data = heatmap_data(R * metric.scale, mask_unseen)
    rows, T = R.shape
    cell = 0.55 if T <= MAX_ANNOTATED else 8 / T
    fig, ax = plt.subplots(figsize=(2.4 + cell * T, 1.3 + cell * max(rows, 2)), layout="constrained")
    cmap = plt.get_cmap("viridis" if metric.higher_is_better else "viridis_r").with_extremes(bad="0.93")
    image = ax.imshow(data, cmap=cmap, norm=_norm(R, metric.scale), aspect="auto")
    if T <= MAX_ANNOTATED:
        _annotate(ax, data, image, decimals(metric))
    ticks = step_ticks(T)
    ax.set_xticks(ticks - 1, labels=ticks)
    ax.set_xlabel("test experience j")
    if _is_offline(R):
        ax.set_yticks([0], labels=["all (offline)"])
    else:
        ax.set_yticks(ticks - 1, labels=ticks)
        ax.set_ylabel("after training step i")
    fig.colorbar(image, ax=ax, label=f"{metric.name}{unit_text(metric)}")
    ax.set_title(title + ("\nj > i: not seen yet (masked)" if mask_unseen else ""), fontsize=8)
    return fig


def _heatmap(scenario: str, strategy: str, metric: MetricSpec, runs: list[dict]) -> Figure | None:
    pairs = _matrices(runs, metric.name)
    if not pairs:
        return None
    R, n = np.mean([R for _, R in pairs], axis=0), len(pairs)
    seeds = "1 seed" if n == 1 else f"mean of {n} seeds"
    return heatmap_figure(f"{scenario} · {strategy}: {metric.name} R[i, j]{unit_text(metric)}, {seeds}", R, metric,
                          _masks_unseen(pairs[0][0], R))


# -------------------------------------------------------------------------------------------------------- files
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@=+-]", "_", name)


def figures(records: list[dict]) -> Iterator[tuple[str, Figure]]:
    """``(file name, figure)`` for every plot of the finished records, one at a time (close each after use)."""
    for scenario, by_strategy in _group(records).items():
        all_runs = [r for runs in by_strategy.values() for r in runs]
        for metric in _metrics(all_runs).values():
            yield f"{_safe(scenario)}__{_safe(metric.name)}.png", _score_curves(scenario, metric, by_strategy)
            for strategy, runs in by_strategy.items():
                if fig := _heatmap(scenario, strategy, metric, runs):
                    yield f"{_safe(scenario)}__{_safe(strategy)}__{_safe(metric.name)}__matrix.png", fig
        params = [s for label, runs in by_strategy.items() if (s := _params_series(label, runs))]
        if any((s.values != s.values[:, :1]).any() for s in params):
            yield f"{_safe(scenario)}__params.png", _params_curves(scenario, params)


def training_curves(records: list[dict], out_dir: str | Path) -> list[Path]:
    """Draw ``artifacts/<run_id>/training_curve.png`` (:func:`clbench.artifacts.plot_log`) for every record whose
    training log is there and whose curve is missing or older than the log; returns the curves drawn."""
    drawn = []
    for record in records:
        folder = Path(out_dir) / "artifacts" / record["run_id"]
        log, curve = folder / artifacts.LOG_FILE, folder / artifacts.CURVE_FILE
        if log.exists() and (not curve.exists() or curve.stat().st_mtime < log.stat().st_mtime):
            drawn.append(artifacts.plot_log(folder))
    return drawn


def plot(records: list[dict], out_dir: str | Path) -> list[Path]:
    """Write the plots of every finished record to ``<out_dir>/plots/`` (atomically; a failed write is an
    :class:`~clbench.errors.OutputError`) and delete the folder's other ``*.png`` files (stale plots of records
    that are gone); draw the runs' missing training curves (:func:`training_curves`); returns the paths written
    under ``plots/``."""
    training_curves(records, out_dir)
    folder = Path(out_dir) / "plots"
    written = []
    for name, fig in figures(records):
        try:
            written.append(files.write_atomic(folder / name, lambda tmp, fig=fig, name=name: fig.savefig(
                tmp, format=Path(name).suffix[1:], dpi=110, bbox_inches="tight")))
        finally:
            plt.close(fig)
    for stale in set(folder.glob("*.png")) - set(written):
        stale.unlink()
    return written
