"""Plots of the records: which files are written, what is drawn in them (data given to matplotlib, not pixels)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgb

from clbench import report
from clbench.metrics import ACCURACY, seen_accuracy

T = 3
CI = np.array([[0.9, 0.0, 0.0], [0.5, 0.8, 0.1], [0.3, 0.4, 0.7]])


def record(scenario: str, strategy: str, seed: int, R, status: str = "finished", totals=None, **info) -> dict:
    """A record as the runner writes it (``accuracy_matrix``); ``totals`` are the parameters per row."""
    R = np.asarray(R, dtype=float)
    return {"run_id": f"{scenario}__{strategy}__s{seed}", "status": status, "seed": seed,
            "spec": {"suite": "s", "scenario": {"name": scenario, "label": ""},
                     "strategy": {"name": strategy, "label": ""}},
            "accuracy_matrix": R.tolist(), "test_sizes": [10, 20, 30][: R.shape[1]],
            "params_per_step": [{"total": t, "trainable": t} for t in (totals or [100] * len(R))],
            "scenario_info": {"task_aware": False, "domain_incremental": False, **info}}


def ranking_record(strategy: str, seed: int) -> dict:
    """A ranking-style record: ``matrices`` and ``metric_specs`` only, no ``accuracy_matrix``."""
    r = record("movielens", strategy, seed, CI)
    del r["accuracy_matrix"]
    r["matrices"] = {"hit@10": (CI + 0.1 * seed).tolist(), "ndcg@10": (CI / 2).tolist()}
    r["metric_specs"] = [{"name": "hit@10", "unit": "%", "higher_is_better": True, "primary": False},
                         {"name": "ndcg@10", "unit": "", "higher_is_better": True, "primary": True,
                          "columns": {"last": "ndcg_last"}}]                     # keys the plots do not use
    return r


RECORDS = [record("split", "naive", 0, CI), record("split", "naive", 1, CI * 0.5),
           record("split", "grow", 0, CI, totals=[100, 110, 120]),
           record("split", "joint", 0, [[0.9, 0.8, 0.7]]),
           record("split", "broken", 0, CI, status="failed"),
           record("split_task", "naive", 0, CI, task_aware=True),
           ranking_record("naive", 0), ranking_record("naive", 1)]


@pytest.fixture
def drawn():
    """``{file name: figure}`` of some records (those named in ``only`` if given); every figure is closed."""
    made = {}

    def make(records, only=None):
        for name, fig in report.figures(records):
            if only is None or name in only:
                made[name] = fig
            else:
                plt.close(fig)
        return made

    yield make
    for fig in made.values():
        plt.close(fig)


def _line(fig, label):
    return next(line for ax in fig.axes for line in ax.get_lines() if line.get_label() == label)


def test_files_written_for_every_metric_and_strategy_failed_records_ignored(tmp_path):
    written = report.plot(RECORDS, tmp_path)
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {p.name for p in written} == {
        "split__accuracy.png", "split__params.png", "split__naive__accuracy__matrix.png",
        "split__grow__accuracy__matrix.png", "split__joint__accuracy__matrix.png",
        "split_task__accuracy.png", "split_task__naive__accuracy__matrix.png",
        "movielens__ndcg@10.png", "movielens__hit@10.png",
        "movielens__naive__ndcg@10__matrix.png", "movielens__naive__hit@10__matrix.png"}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


def test_records_without_matrices_fall_back_to_accuracy_as_primary_metric_in_percent():
    (metric, R), = report.scores(RECORDS[0]).values()
    assert metric == ACCURACY and metric.unit == "%" and metric.primary and metric.scale == 100
    np.testing.assert_array_equal(R, CI)
    assert list(report.scores(ranking_record("naive", 0))) == ["ndcg@10", "hit@10"]     # primary first


def test_curve_is_seed_mean_of_seen_accuracy_with_std_band_and_offline_run_as_one_point(drawn):
    fig = drawn(RECORDS)["split__accuracy.png"]
    per_seed = [[100 * seen_accuracy(R, [10, 20, 30], i) for i in range(T)] for R in (CI, CI * 0.5)]
    line = _line(fig, "naive (n=2)")                                  # seed counts differ: each label has its n
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3])
    np.testing.assert_allclose(line.get_ydata(), np.mean(per_seed, axis=0))
    band = next(c for c in line.axes.collections if np.allclose(c.get_facecolor()[0][:3], to_rgb(line.get_color())))
    low, high = np.mean(per_seed, 0) - np.std(per_seed, 0, ddof=1), np.mean(per_seed, 0) + np.std(per_seed, 0, ddof=1)
    edge = band.get_paths()[0].vertices[:, 1]
    assert edge.min() == pytest.approx(low.min()) and edge.max() == pytest.approx(high.max())
    x, y = _line(fig, "joint (offline) (n=1)").get_data()
    np.testing.assert_array_equal(x, [T])
    np.testing.assert_allclose(y, [100 * (0.9 * 10 + 0.8 * 20 + 0.7 * 30) / 60])
    assert "1–2 seeds" in fig._suptitle.get_text() and "accuracy" in fig._suptitle.get_text()


def test_step_ticks_are_the_integer_matrix_rows_in_curves_and_heatmaps(drawn):
    figs = drawn(RECORDS)
    np.testing.assert_array_equal(figs["split__accuracy.png"].axes[-1].get_xticks(), [1, 2, 3])
    heat = figs["split__naive__accuracy__matrix.png"].axes[0]
    assert [t.get_text() for t in heat.get_yticklabels()] == ["1", "2", "3"]
    assert [t.get_text() for t in heat.get_xticklabels()] == ["1", "2", "3"]
    np.testing.assert_array_equal(heat.get_yticks(), [0, 1, 2])                          # rows of R, 0-based
    long = report.step_ticks(50)
    assert long[0] == 1 and long.dtype.kind == "i" and len(long) <= report.MAX_TICKS and set(np.diff(long)) == {3}


def test_unseen_triangle_masked_in_class_incremental_only(drawn):
    figs = drawn(RECORDS)
    class_il = figs["split__naive__accuracy__matrix.png"].axes[0].images[0].get_array()
    np.testing.assert_array_equal(np.ma.getmaskarray(class_il), np.triu(np.ones((T, T), bool), k=1))
    np.testing.assert_allclose(class_il.compressed(), 100 * np.mean([CI, CI * 0.5], 0)[np.tril_indices(T)])
    for name in ("split_task__naive__accuracy__matrix.png", "split__joint__accuracy__matrix.png"):
        assert not np.ma.getmaskarray(figs[name].axes[0].images[0].get_array()).any(), name


def test_each_drawn_cell_shows_its_value_in_the_metric_unit_with_contrasting_colour(drawn):
    figs = drawn(RECORDS)
    texts = figs["split__grow__accuracy__matrix.png"].axes[0].texts
    assert sorted(t.get_text() for t in texts) == sorted(f"{100 * v:.1f}" for v in CI[np.tril_indices(T)])
    colour = {t.get_text(): t.get_color() for t in texts}
    assert colour["30.0"] == "white" and colour["90.0"] == "black"                      # dark vs light viridis
    unitless = figs["movielens__naive__ndcg@10__matrix.png"].axes[0]
    assert "0.450" in {t.get_text() for t in unitless.texts}                           # CI/2, no x100
    pct = figs["movielens__naive__hit@10__matrix.png"].axes[0].images[0].get_array()
    assert pct[0, 0] == pytest.approx(100 * (0.9 + 1.0) / 2)


def test_params_plot_only_when_some_strategy_changes_its_parameters(drawn):
    constant = [r for r in RECORDS if r["spec"]["strategy"]["name"] != "grow"]
    assert "split__params.png" not in drawn(constant)
    fig = drawn(RECORDS)["split__params.png"]
    assert {line.get_label() for ax in fig.axes for line in ax.get_lines()} == {"grow (n=1)", "naive (n=2)"}
    np.testing.assert_allclose(_line(fig, "grow (n=1)").get_ydata(), [0.1, 0.11, 0.12])        # in K


@pytest.mark.parametrize("n", [16, 30])
def test_many_strategies_split_into_panels_of_distinct_lines_ranked_by_final_value(n, drawn):
    records = [record("many", f"s{k:02d}", 0, CI * (k + 1) / n) for k in range(n)]
    fig = drawn(records, only={"many__accuracy.png"})["many__accuracy.png"]
    panels = [ax for ax in fig.axes if ax.get_lines()]
    assert len(panels) == -(-n // report.MAX_LINES_PER_PANEL)
    finals = []
    for ax in panels:
        lines = ax.get_lines()
        assert len(lines) <= report.MAX_LINES_PER_PANEL
        assert len({(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines}) == len(lines)
        assert len({line.get_color() for line in lines}) == len(lines)
        assert len({line.get_linestyle() for line in lines}) == 3 and len({line.get_marker() for line in lines}) == 7
        assert ax.get_legend().get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1   # legend outside axes
        finals += [line.get_ydata()[-1] for line in lines]
    assert finals == sorted(finals, reverse=True) and len(finals) == n


def test_records_of_different_identities_are_never_averaged_into_one_line(drawn):
    """Two replay runs under one label with different memories (seeds 0 and 1): two lines labelled by the key that
    differs, as the leaderboard's rows are, not one mean over 'two seeds'."""
    small, large = record("split", "replay", 0, CI), record("split", "replay", 1, CI * 0.5)
    small["strategy_config"], large["strategy_config"] = {"mem_size": 20}, {"mem_size": 200}
    fig = drawn([small, large], only={"split__accuracy.png"})["split__accuracy.png"]
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert labels == {"replay [mem_size=20]", "replay [mem_size=200]"}
