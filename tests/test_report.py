"""Plots of the records: which files are written, what is drawn in them (data given to matplotlib, not pixels).

Each test draws only the figures it reads (``_figure`` stops the generator at the one asked for), so that the tests
stay fast under mutation testing; nothing is cached across tests (mutmut maps a test to the functions it calls)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgb, to_rgba
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.ticker import LogLocator, NullFormatter
from PIL import Image

from clbench import artifacts, report
from clbench.metrics import ACCURACY, MetricSpec, seen_accuracy

T = 3
CI = np.array([[0.9, 0.0, 0.0], [0.5, 0.8, 0.1], [0.3, 0.4, 0.7]])
SPREAD = "line: mean over {}; band (bar for single points): ± 1 std (sample) over seeds"


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


SPLIT = [record("split", "naive", 0, CI), record("split", "naive", 1, CI * 0.5),
         record("split", "grow", 0, CI, totals=[100, 110, 120]),
         record("split", "joint", 0, [[0.9, 0.8, 0.7]]),
         record("split", "broken", 0, CI, status="failed")]
RANKING = [ranking_record("naive", 0), ranking_record("naive", 1)]
RECORDS = [*SPLIT, record("split_task", "naive", 0, CI, task_aware=True), *RANKING]
NAMES = ["split__accuracy.png", "split__grow__accuracy__matrix.png", "split__joint__accuracy__matrix.png",
         "split__naive__accuracy__matrix.png", "split__params.png", "split_task__accuracy.png",
         "split_task__naive__accuracy__matrix.png", "movielens__ndcg@10.png", "movielens__naive__ndcg@10__matrix.png",
         "movielens__hit@10.png", "movielens__naive__hit@10__matrix.png"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _figure(records, name):
    """The figure ``name`` of ``records``, drawing only the figures yielded before it."""
    for found, fig in report.figures(records):
        if found == name:
            return fig
        plt.close(fig)
    raise AssertionError(f"{name} not drawn")


def _names(records):
    """The file names ``figures`` yields for ``records`` (each figure closed at once)."""
    names = []
    for name, fig in report.figures(records):
        names.append(name)
        plt.close(fig)
    return names


def _line(fig, label):
    return next(line for ax in fig.axes for line in ax.get_lines() if line.get_label() == label)


def _series(label, finals, seeds=1):
    """A 3-step series ending at each seed's value in ``finals`` (one value: that many identical seeds)."""
    values = np.array([[0.1, 0.2, f] for f in np.broadcast_to(finals, (seeds,))])
    return report.Series(label, np.arange(1, 4), values)


# ---------------------------------------------------------------------------------------------------------- files
def test_figure_names_and_order_for_every_metric_and_strategy_failed_records_ignored():
    """One curve per (scenario, metric), primary metric first, then a heatmap per strategy sorted by label, then the
    params plot; scenarios in record order; the failed record draws nothing. Catches a lost, extra or renamed
    file and a changed order."""
    assert _names(RECORDS) == NAMES


def test_plot_writes_png_files_at_110_dpi_cropped_to_the_drawing(tmp_path):
    """``plot`` creates missing parent folders, writes each figure as a PNG at 110 dpi cropped to what is drawn
    (not the figure's full canvas), returns the paths, and can write again into the same folder. Catches a changed
    dpi or crop, a folder that must exist, and a second run that fails."""
    out = tmp_path / "a" / "b"
    written = report.plot([record("split", "naive", 0, CI)], out)
    assert written == [out / "plots" / "split__accuracy.png", out / "plots" / "split__naive__accuracy__matrix.png"]
    for path in written:
        image = Image.open(path)
        assert image.format == "PNG" and image.info["dpi"] == pytest.approx((110, 110), abs=0.01)
    assert Image.open(written[0]).size != (8 * 110, round(3.6 * 110))               # bbox_inches="tight"
    assert report.plot([record("split", "naive", 0, CI)], out) == written


def test_plot_removes_png_files_of_rows_no_longer_in_the_records(tmp_path):
    """Drawing again after a strategy's records are gone deletes that strategy's matrix (and any other PNG in
    ``plots/`` that was not written this time) and keeps files that are not PNGs. Catches a folder that still shows
    a removed row's plot beside the new ones."""
    both = report.plot([record("split", "naive", 0, CI), record("split", "replay", 0, CI)], tmp_path)
    (tmp_path / "plots" / "notes.txt").write_text("mine")
    assert tmp_path / "plots" / "split__replay__accuracy__matrix.png" in both
    one = report.plot([record("split", "naive", 0, CI)], tmp_path)
    assert sorted((tmp_path / "plots").glob("*.png")) == sorted(one)
    assert not (tmp_path / "plots" / "split__replay__accuracy__matrix.png").exists()
    assert (tmp_path / "plots" / "notes.txt").read_text() == "mine"


def test_plot_draws_the_training_curves_missing_beside_the_runs_logs(tmp_path):
    """A run folder with ``training_log.jsonl`` but no ``training_curve.png`` (the reference folders keep only the
    logs) gets its curve back from ``plot``; a curve newer than its log is left as it is, one older is redrawn, a run
    without a log gets none, and the curves are not among the ``plots/`` files returned. Catches ``report`` no
    longer redrawing the curves that report.md links."""
    logged, bare = record("split", "naive", 0, CI), record("split", "replay", 0, CI)
    folder = tmp_path / "artifacts" / logged["run_id"]
    folder.mkdir(parents=True)
    (folder / artifacts.LOG_FILE).write_text(json.dumps(
        {"member": "", "experience": 0, "epoch": 0, "step": 0, "batches": 2, "loss": 1.0, "lr": 0.1}) + "\n")
    written = report.plot([logged, bare], tmp_path)
    curve = folder / artifacts.CURVE_FILE
    assert Image.open(curve).format == "PNG" and curve not in written
    assert not (tmp_path / "artifacts" / bare["run_id"]).exists()
    assert report.training_curves([logged], tmp_path) == []
    os.utime(curve, (0, 0))
    assert report.training_curves([logged], tmp_path) == [curve]


def test_names_keep_only_file_safe_characters():
    """Scenario, strategy and metric names become file names with every character outside ``A-Za-z0-9_.@=+-``
    replaced by ``_`` (upper and lower case kept). Catches names with spaces or slashes in paths and a changed
    character class."""
    r = record("x", "Big Net", 0, CI)
    r["spec"]["scenario"]["label"] = "CIFAR split/5 [n=2]"
    assert _names([r]) == ["CIFAR_split_5__n=2___accuracy.png", "CIFAR_split_5__n=2___Big_Net__accuracy__matrix.png"]


# --------------------------------------------------------------------------------------------------------- scores
def test_records_without_matrices_fall_back_to_accuracy_as_primary_metric_in_percent():
    """``accuracy_matrix`` alone is the primary metric accuracy in %; ranking records list the primary metric
    first. Catches a lost fallback or primary order."""
    (metric, R), = report.scores(RECORDS[0]).values()
    assert metric == ACCURACY and metric.unit == "%" and metric.primary and metric.scale == 100
    np.testing.assert_array_equal(R, CI)
    assert list(report.scores(ranking_record("naive", 0))) == ["ndcg@10", "hit@10"]     # primary first


def test_a_matrix_without_a_spec_is_a_unitless_metric_of_its_name_and_integers_become_floats():
    """A matrix no stored spec describes gets ``MetricSpec(name)`` (unitless, not primary, after the primary one);
    integer entries (0/1 hits) are read as float64. Catches a crash or a borrowed spec for an undescribed matrix."""
    r = record("x", "a", 0, CI)
    r["matrices"] = {"hits": [[1, 0], [0, 1]], "accuracy": CI.tolist()}
    found = report.scores(r)
    assert list(found) == ["accuracy", "hits"]
    assert found["accuracy"][0] == ACCURACY and found["hits"][0] == MetricSpec("hits")
    assert found["hits"][1].dtype == np.float64


# --------------------------------------------------------------------------------------------------------- curves
def test_curve_is_seed_mean_of_seen_accuracy_with_std_band_and_offline_run_as_one_point():
    """The curve of a metric: per step the seed mean of the test-size-weighted seen accuracy (x100), a band of
    exactly mean ± sample std, an offline run as one point at the last step. Catches a wrong weight, mean, std or
    step."""
    fig = _figure(SPLIT, "split__accuracy.png")
    per_seed = [[100 * seen_accuracy(R, [10, 20, 30], i) for i in range(T)] for R in (CI, CI * 0.5)]
    line = _line(fig, "naive (n=2)")                                  # seed counts differ: each label has its n
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3])
    mean, std = np.mean(per_seed, axis=0), np.std(per_seed, axis=0, ddof=1)
    np.testing.assert_allclose(line.get_ydata(), mean)
    (band,) = line.axes.collections
    edge = {tuple(v) for v in band.get_paths()[0].vertices.round(6)}
    assert edge == {(x, round(y, 6)) for x, y in zip([1, 2, 3, 1, 2, 3], [*(mean - std), *(mean + std)])}
    x, y = _line(fig, "joint (offline) (n=1)").get_data()
    np.testing.assert_array_equal(x, [T])
    np.testing.assert_allclose(y, [100 * (0.9 * 10 + 0.8 * 20 + 0.7 * 30) / 60])
    np.testing.assert_allclose(_line(fig, "grow (n=1)").get_ydata(), per_seed[0])


def test_curve_figure_layout_and_style():
    """The look of a curve figure: 8 x 3.6 in for one panel, constrained layout, the title and spread note (9 pt),
    lines ranked by final value taking colour/style/marker k of tab10 x (-, --, :) x 7 markers, hollow 6 pt markers,
    1.4 pt lines, a 15% band without edge in the line's colour, grid at 30%, a legend outside at (1.01, 1) in 7 pt
    without frame or title, integer step ticks, x from 0.7 to T + 0.3 and both axis labels. Catches any dropped or
    changed setting."""
    fig = _figure(SPLIT, "split__accuracy.png")
    (ax,) = fig.axes
    assert tuple(fig.get_size_inches()) == (8, 3.6) and isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    assert fig._suptitle.get_text() == ("split: accuracy on the experiences seen so far (%)\n"
                                        + SPREAD.format("1–2 seeds"))
    assert fig._suptitle.get_fontsize() == 9
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["joint (offline) (n=1)", "grow (n=1)", "naive (n=2)"]  # 76.7/53/40
    for k, line in enumerate(lines):
        assert to_rgb(line.get_color()) == report._COLORS[k]
        assert (line.get_linestyle(), line.get_marker()) == (("-", "--", ":")[k], ("o", "s", "^")[k])
        assert line.get_markersize() == 6 and line.get_markerfacecolor() == "none" and line.get_linewidth() == 1.4
    (band,) = ax.collections
    assert band.get_alpha() == 0.15 and list(band.get_linewidth()) == [0]
    assert tuple(band.get_facecolor()[0]) == pytest.approx((*report._COLORS[2], 0.15))
    grid = ax.yaxis.get_gridlines()[0]
    assert grid.get_visible() and grid.get_alpha() == 0.3
    legend = ax.get_legend()
    assert legend._loc == 2 and not legend.get_frame_on() and legend.get_title().get_text() == ""
    assert legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).bounds[:2] == pytest.approx((1.01, 1.0))
    assert {t.get_fontsize() for t in legend.get_texts()} == {7} and legend.get_title().get_fontsize() == 7
    np.testing.assert_array_equal(ax.get_xticks(), [1, 2, 3])
    assert ax.get_xlim() == pytest.approx((0.7, 3.3)) and ax.get_yscale() == "linear"
    assert ax.get_xlabel() == "training step i (after experience i)"
    assert ax.get_ylabel() == "accuracy (%), seen experiences"


def test_unitless_metric_curve_is_not_scaled_and_a_percent_one_is():
    """ndcg (no unit) is drawn as stored with no unit in the title; hit@10 (%) x100. Catches a wrong scale or unit
    text."""
    fig = _figure(RANKING, "movielens__ndcg@10.png")
    assert fig._suptitle.get_text().splitlines()[0] == "movielens: ndcg@10 on the experiences seen so far"
    assert fig.axes[0].get_ylabel() == "ndcg@10, seen experiences"
    np.testing.assert_allclose(_line(fig, "naive").get_ydata()[-1], seen_accuracy(CI / 2, [10, 20, 30], 2))
    hit = _figure(RANKING, "movielens__hit@10.png")
    expected = 100 * np.mean([seen_accuracy(CI + 0.1 * s, [10, 20, 30], 2) for s in (0, 1)])
    np.testing.assert_allclose(_line(hit, "naive").get_ydata()[-1], expected)


def test_records_without_test_sizes_weight_every_experience_equally():
    """No ``test_sizes``: each experience counts once in the seen accuracy. Catches a crash or other weights."""
    r = record("split", "naive", 0, CI)
    del r["test_sizes"]
    fig = _figure([r], "split__accuracy.png")
    np.testing.assert_allclose(_line(fig, "naive").get_ydata(), [90, 65, 140 / 3])


def test_a_lower_is_better_metric_ranks_its_lowest_final_value_first():
    """For a loss the best (lowest) line gets rank 1: the first colour and the top of the legend. Catches ranking
    in the wrong direction."""
    records = []
    for strategy, scale in (("a", 1.0), ("b", 0.5)):
        r = record("x", strategy, 0, CI)
        r["matrices"] = {"loss": (CI * scale).tolist()}
        r["metric_specs"] = [{"name": "loss", "unit": "", "higher_is_better": False, "primary": True}]
        records.append(r)
    fig = _figure(records, "x__loss.png")
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["b", "a"]


def test_a_single_point_over_seeds_gets_an_error_bar_in_its_colour():
    """An offline series with several seeds is one point with a ± sample std bar (3-pt caps, no connecting line)
    in the line's colour, no band; one seed count: no "(n=...)" in labels. Catches a missing or wrong bar."""
    fig = report.lines_figure([report.Series("j", np.array([3]), np.array([[0.5], [0.7]]))], "t", "y", scale=100)
    ax = fig.axes[0]
    assert fig._suptitle.get_text() == "t\n" + SPREAD.format("2 seeds")
    data, caps, (bars,) = ax.containers[0].lines
    np.testing.assert_allclose(data.get_xydata(), [[3, 60]])
    assert data.get_linestyle() == "None" and [cap.get_markersize() for cap in caps] == [6, 6]
    std = 100 * np.std([0.5, 0.7], ddof=1)
    np.testing.assert_allclose(bars.get_segments()[0], [[3, 60 - std], [3, 60 + std]])
    assert tuple(bars.get_color()[0][:3]) == report._COLORS[0]
    assert [type(c).__name__ for c in ax.collections] == ["LineCollection"]
    assert [line.get_label() for line in ax.get_lines()][0] == "j"


def test_spread_note_names_the_seed_counts():
    """One seed everywhere: "no spread shown" and no band; several counts: their range from the smallest to the
    largest (1–5 with counts 1, 2, 5). Catches a wrong note, a range ending at the second count, or a band drawn
    from one seed."""
    one = report.lines_figure([_series("a", 0.5)], "t", "y")
    assert one._suptitle.get_text() == "t\n1 seed: no spread shown" and not one.axes[0].collections
    mixed = report.lines_figure([_series("a", 0.5, seeds=2), _series("b", 0.4, seeds=5)], "t", "y")
    assert mixed._suptitle.get_text() == "t\n" + SPREAD.format("2–5 seeds")
    three = report.lines_figure([_series("a", 0.5, seeds=5), _series("b", 0.4), _series("c", 0.3, seeds=2)], "t", "y")
    assert three._suptitle.get_text() == "t\n" + SPREAD.format("1–5 seeds")          # smallest to largest count
    assert {line.get_label() for line in mixed.axes[0].get_lines()} == {"a (n=2)", "b (n=5)"}


def test_lines_figure_defaults_draw_values_as_given_ranked_highest_first():
    """Without ``scale`` and ``descending`` the lines are the stored means (scale 1) ranked highest final value
    first. Catches a changed default scale or ranking direction."""
    fig = report.lines_figure([_series("a", 0.5), _series("b", 0.9)], "t", "y")
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["b", "a"]
    np.testing.assert_allclose(_line(fig, "a").get_ydata(), [0.1, 0.2, 0.5])


def test_curve_style_does_not_follow_the_users_matplotlib_style():
    """Under a style with 3-pt markers and an all-black colour cycle, lines keep their 6-pt markers and the error
    bars of single points the colour of their line (tab10 colours 0 and 1). Catches a marker size or bar colour
    left to rcParams."""
    with plt.rc_context({"lines.markersize": 3, "axes.prop_cycle": plt.cycler(color=["black"])}):
        single = [report.Series(k, np.array([3]), np.array([[v], [v + 0.2]])) for k, v in (("p", 0.7), ("q", 0.5))]
        fig = report.lines_figure(single, "t", "y")
    ax = fig.axes[0]
    assert [line.get_markersize() for line in ax.get_lines() if line.get_label() in ("p", "q")] == [6, 6]
    assert [tuple(c.lines[2][0].get_color()[0][:3]) for c in ax.containers] == list(report._COLORS[:2])


def test_a_two_step_series_over_seeds_gets_a_band_not_bars():
    """Two steps are a line: its spread is a band (one PolyCollection), no error bars. Catches bars for a two-step
    curve."""
    fig = report.lines_figure([report.Series("a", np.arange(1, 3), np.array([[0.1, 0.2], [0.3, 0.6]]))], "t", "y")
    ax = fig.axes[0]
    assert not ax.containers and [type(c).__name__ for c in ax.collections] in (["PolyCollection"],
                                                                                ["FillBetweenPolyCollection"])


def test_one_experience_is_continual_and_one_row_over_two_experiences_is_offline():
    """A 1 x 1 matrix (one experience, one step) is a continual run: no "(offline)" label, its heatmap row is step
    1 and carries the unseen note; a 1 x 2 matrix is offline: "(offline)", one point at step 2, its row "all
    (offline)". Catches an offline test that needs three experiences or accepts one."""
    single = [record("one", "naive", 0, [[0.8]])]
    assert [line.get_label() for line in _figure(single, "one__accuracy.png").axes[0].get_lines()] == ["naive"]
    ax = _figure(single, "one__naive__accuracy__matrix.png").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1"] and ax.get_title().endswith("(masked)")
    joint = [record("two", "joint", 0, [[0.9, 0.6]])]
    x, y = _line(_figure(joint, "two__accuracy.png"), "joint (offline)").get_data()
    np.testing.assert_array_equal(x, [2])
    np.testing.assert_allclose(y, [100 * (0.9 * 10 + 0.6 * 20) / 30])
    ax = _figure(joint, "two__joint__accuracy__matrix.png").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["all (offline)"]


def test_step_ticks_are_the_integer_matrix_rows_in_curves_and_heatmaps():
    """Ticks 1..T on curves and heatmaps (0-based rows of R labelled 1-based), every k-th for long streams.
    Catches off-by-one ticks."""
    heat = _figure(SPLIT, "split__grow__accuracy__matrix.png").axes[0]
    assert [t.get_text() for t in heat.get_yticklabels()] == ["1", "2", "3"]
    assert [t.get_text() for t in heat.get_xticklabels()] == ["1", "2", "3"]
    np.testing.assert_array_equal(heat.get_yticks(), [0, 1, 2])                          # rows of R, 0-based
    np.testing.assert_array_equal(heat.get_xticks(), [0, 1, 2])
    np.testing.assert_array_equal(report.step_ticks(20), np.arange(1, 21))
    np.testing.assert_array_equal(report.step_ticks(21), np.arange(1, 22, 2))
    long = report.step_ticks(50)
    assert long[0] == 1 and long.dtype.kind == "i" and len(long) <= report.MAX_TICKS and set(np.diff(long)) == {3}


@pytest.mark.parametrize("n", [16, 30])
def test_many_strategies_split_into_panels_of_distinct_lines_ranked_by_final_value(n):
    """More than 10 strategies: balanced panels (8+8, 10+10+10) ranked by final value, each titled with its ranks,
    sharing both axes, 3 in tall each; every line of a panel has its own colour, style and marker; the x label only
    under the last panel. Catches unbalanced, unranked or unshared panels and repeated styles."""
    records = [record("many", f"s{k:02d}", 0, CI * (k + 1) / n) for k in range(n)]
    fig = _figure(records, "many__accuracy.png")
    panels = fig.axes
    size = n // len(panels)
    assert len(panels) == -(-n // report.MAX_LINES_PER_PANEL)
    assert tuple(fig.get_size_inches()) == pytest.approx((8, 0.6 + 3.0 * len(panels)))
    assert [ax.get_legend().get_title().get_text() for ax in panels] == [
        f"ranks {1 + k * size}–{(k + 1) * size} (last step)" for k in range(len(panels))]
    assert all(panels[0].get_shared_x_axes().joined(panels[0], ax) for ax in panels)
    assert all(panels[0].get_shared_y_axes().joined(panels[0], ax) for ax in panels)
    assert [ax.get_xlabel() for ax in panels][-1] != "" and {ax.get_xlabel() for ax in panels[:-1]} == {""}
    finals = []
    for ax in panels:
        lines = ax.get_lines()
        assert len(lines) == size
        assert len({(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines}) == len(lines)
        assert len({line.get_color() for line in lines}) == len(lines)
        assert len({line.get_linestyle() for line in lines}) == 3 and len({line.get_marker() for line in lines}) == 7
        assert ax.get_legend().get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1   # legend outside axes
        finals += [line.get_ydata()[-1] for line in lines]
    assert finals == sorted(finals, reverse=True) and len(finals) == n


@pytest.mark.parametrize(("n", "sizes"), [(10, [10]), (11, [6, 5]), (21, [7, 7, 7])])
def test_panels_are_balanced_and_ascending_when_lower_is_better(n, sizes):
    """At most 10 lines per panel, as even as possible; with ``descending=False`` the lowest final value comes
    first. Catches a last panel of one line and the wrong ranking direction."""
    fig = report.lines_figure([_series(f"s{k}", k / n) for k in range(n)], "t", "y", descending=False)
    assert [len(ax.get_lines()) for ax in fig.axes] == sizes
    assert [line.get_label() for ax in fig.axes for line in ax.get_lines()] == [f"s{k}" for k in range(n)]


def test_records_of_different_identities_are_never_averaged_into_one_line():
    """Two replay runs under one label with different memories (seeds 0 and 1): two lines labelled by the key that
    differs, as the leaderboard's rows are, not one mean over 'two seeds'."""
    small, large = record("split", "replay", 0, CI), record("split", "replay", 1, CI * 0.5)
    small["strategy_config"], large["strategy_config"] = {"mem_size": 20}, {"mem_size": 200}
    fig = _figure([small, large], "split__accuracy.png")
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert labels == {"replay [mem_size=20]", "replay [mem_size=200]"}


# --------------------------------------------------------------------------------------------------------- params
def test_params_plot_only_when_some_strategy_changes_its_parameters():
    """The params plot exists only when a total changes between steps; offline runs (one entry) are not in it;
    under a million parameters it is in K on a linear axis. Catches a params plot of constant models, an offline
    line, or a wrong unit."""
    constant = [r for r in RECORDS if r["spec"]["strategy"]["name"] != "grow"]
    assert "split__params.png" not in _names(constant)
    fig = _figure(SPLIT, "split__params.png")
    assert {line.get_label() for ax in fig.axes for line in ax.get_lines()} == {"grow (n=1)", "naive (n=2)"}
    np.testing.assert_allclose(_line(fig, "grow (n=1)").get_ydata(), [0.1, 0.11, 0.12])        # in K
    np.testing.assert_array_equal(_line(fig, "grow (n=1)").get_xdata(), [1, 2, 3])
    assert fig._suptitle.get_text().splitlines()[0] == "split: total parameters per step (K)"
    assert fig.axes[0].get_ylabel() == "parameters (K)" and fig.axes[0].get_yscale() == "linear"


def test_params_in_millions_on_a_log_axis_when_sizes_span_more_than_ten_times():
    """From 1e6 parameters up the unit is M; sizes spanning more than 10x get a log axis ticked at 1, 2, 5 x 10^k
    written as plain numbers, no minor labels; exactly 10x stays linear, 10.00001x is log. Catches wrong thresholds
    (on either side of 10x), unit or axis."""
    grow = record("x", "grow", 0, CI, totals=[100_000, 500_000, 2_000_000])
    fixed = record("x", "fixed", 0, CI, totals=[100_000] * 3)
    fig = _figure([grow, fixed], "x__params.png")
    ax = fig.axes[0]
    assert fig._suptitle.get_text().splitlines()[0] == "x: total parameters per step (M)"
    assert ax.get_ylabel() == "parameters (M, log scale)" and ax.get_yscale() == "log"
    np.testing.assert_allclose(_line(fig, "grow").get_ydata(), [0.1, 0.5, 2.0])
    locator = ax.yaxis.get_major_locator()
    assert isinstance(locator, LogLocator) and list(locator._subs) == [1.0, 2.0, 5.0]
    assert [ax.yaxis.get_major_formatter()(v, 0) for v in (0.05, 2.0, 200000.0)] == ["0.05", "2", "200000"]
    assert isinstance(ax.yaxis.get_minor_formatter(), NullFormatter)
    edge = record("x", "grow", 0, CI, totals=[100_000, 1_000_000, 1_000_000])
    fig = _figure([edge], "x__params.png")
    assert fig.axes[0].get_ylabel() == "parameters (M)" and fig.axes[0].get_yscale() == "linear"
    over = record("x", "grow", 0, CI, totals=[100_000, 1_000_001, 1_000_001])                   # 10.00001x: log
    fig = _figure([over], "x__params.png")
    assert fig.axes[0].get_ylabel() == "parameters (M, log scale)" and fig.axes[0].get_yscale() == "log"


def test_a_two_step_run_has_a_params_curve_of_float64_totals():
    """Two steps are enough for a parameter curve (only a single entry, an offline run, is left out), and the
    totals are held as float64 whatever the record stores. Catches a threshold of more than two steps and integer
    series values."""
    two = record("x", "grow", 0, CI[:2, :2], totals=[100, 300])
    assert report._params_series("grow", [record("x", "joint", 0, [[0.9, 0.8]], totals=[100])]) is None
    series = report._params_series("grow", [two])
    assert series.values.dtype == np.float64
    np.testing.assert_array_equal(series.steps, [1, 2])
    fig = _figure([two], "x__params.png")
    np.testing.assert_allclose(_line(fig, "grow").get_ydata(), [0.1, 0.3])


# ------------------------------------------------------------------------------------------------------- heatmaps
def test_unseen_triangle_masked_in_class_incremental_only():
    """Cells j > i are masked in class-incremental runs (also when ``scenario_info`` is missing), not in task- or
    domain-incremental ones, nor offline. Catches a mask on seen cells or none on unseen ones."""
    class_il = _figure(SPLIT, "split__naive__accuracy__matrix.png").axes[0].images[0].get_array()
    np.testing.assert_array_equal(np.ma.getmaskarray(class_il), np.triu(np.ones((T, T), bool), k=1))
    np.testing.assert_allclose(class_il.compressed(), 100 * np.mean([CI, CI * 0.5], 0)[np.tril_indices(T)])
    bare = record("b", "naive", 0, CI)
    del bare["scenario_info"]
    cases = {"split__joint__accuracy__matrix.png": (SPLIT, False),
             "t__naive__accuracy__matrix.png": ([record("t", "naive", 0, CI, task_aware=True)], False),
             "d__naive__accuracy__matrix.png": ([record("d", "naive", 0, CI, domain_incremental=True)], False),
             "b__naive__accuracy__matrix.png": ([bare], True)}
    for name, (records, masked) in cases.items():
        data = _figure(records, name).axes[0].images[0].get_array()
        assert np.ma.getmaskarray(data).any() == masked, name


def test_heatmap_layout_and_style():
    """The look of a heatmap: 0.55 in per cell plus margins, constrained layout, viridis (reversed for
    lower-is-better) with masked cells in light grey, colours over [0, 100] for percentages, auto aspect, axis
    labels, the colour bar of the image with its label, the title with the seed count and the mask note (8 pt);
    an offline matrix is one row labelled "all (offline)". Catches any dropped or changed setting."""
    fig = _figure(SPLIT, "split__naive__accuracy__matrix.png")
    ax, bar = fig.axes
    image = ax.images[0]
    assert tuple(fig.get_size_inches()) == pytest.approx((2.4 + 0.55 * 3, 1.3 + 0.55 * 3))
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    assert image.get_cmap().name == "viridis" and image.get_cmap().get_bad() == pytest.approx(to_rgba("0.93"))
    assert (image.norm.vmin, image.norm.vmax) == (0, 100) and ax.get_aspect() == "auto"
    assert ax.get_title() == "split · naive: accuracy R[i, j] (%), mean of 2 seeds\nj > i: not seen yet (masked)"
    assert ax.title.get_fontsize() == 8
    assert (ax.get_xlabel(), ax.get_ylabel(), bar.get_ylabel()) == ("test experience j", "after training step i",
                                                                     "accuracy (%)")
    assert image.colorbar.ax is bar and image.colorbar.mappable is image                 # the bar of this image
    offline = _figure(SPLIT, "split__joint__accuracy__matrix.png")
    ax = offline.axes[0]
    assert tuple(offline.get_size_inches()) == pytest.approx((2.4 + 0.55 * 3, 1.3 + 0.55 * 2))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["all (offline)"] and list(ax.get_yticks()) == [0]
    assert ax.get_ylabel() == "" and ax.get_title() == "split · joint: accuracy R[i, j] (%), 1 seed"
    loss = report.heatmap_figure("t", np.array([[2.0, 5.0], [3.0, 4.0]]), MetricSpec("loss", higher_is_better=False),
                                 mask_unseen=False)
    image = loss.axes[0].images[0]
    assert image.get_cmap().name == "viridis_r" and (image.norm.vmin, image.norm.vmax) == (2.0, 5.0)
    assert loss.axes[0].get_title() == "t" and loss.axes[1].get_ylabel() == "loss"


def test_colour_range_is_the_full_fraction_range_or_the_data_range():
    """Fractions (all in [0, 1], bounds included) are coloured over [0, 1] scaled; anything else over the data's
    range. Catches a colour scale that moves with the data for fractions, or clips other values."""
    def norm(R, metric):
        image = report.heatmap_figure("t", np.array(R), metric, mask_unseen=False).axes[0].images[0]
        return image.norm.vmin, image.norm.vmax

    assert norm([[0.2, 1.0], [0.5, 0.6]], ACCURACY) == (0, 100)
    assert norm([[0.0, 0.5], [0.25, 0.75]], MetricSpec("ndcg")) == (0, 1)
    assert norm([[-0.5, 0.5], [0.25, 0.75]], MetricSpec("delta")) == (-0.5, 0.75)
    assert norm([[0.5, 1.5], [0.25, 0.75]], MetricSpec("ratio")) == (0.25, 1.5)


def test_colour_range_of_non_fractions_is_scaled_and_spans_the_masked_cells_too():
    """Percent-scaled values outside [0, 1] are coloured over 100 x (min, max) of the whole matrix, the masked
    unseen cells included (here -1.0 and 2.0 sit in the masked triangle, so the drawn cells span only 20..70).
    Catches a bound divided by the scale instead of multiplied, and a bound left to matplotlib's autoscaling of the
    drawn cells."""
    R = np.array([[0.5, -1.0, 2.0], [0.2, 0.6, 0.1], [0.3, 0.4, 0.7]])
    image = report.heatmap_figure("t", R, ACCURACY, mask_unseen=True).axes[0].images[0]
    assert image.get_array().compressed().min() == pytest.approx(20)
    assert (image.norm.vmin, image.norm.vmax) == pytest.approx((-100, 200))


def test_each_drawn_cell_shows_its_value_in_the_metric_unit_with_contrasting_colour():
    """Every drawn cell carries its value (1 decimal for %, 3 otherwise), centred, 8 pt, black where the cell's
    colour is light (luminance 0.299 r + 0.587 g + 0.114 b above 0.5) and white where dark. Catches missing,
    misplaced or wrongly rounded values and unreadable text."""
    fig = _figure(SPLIT, "split__grow__accuracy__matrix.png")
    texts = fig.axes[0].texts
    assert sorted(t.get_text() for t in texts) == sorted(f"{100 * v:.1f}" for v in CI[np.tril_indices(T)])
    assert {t.get_position(): t.get_text() for t in texts}[(0, 2)] == "30.0"             # x = column j, y = row i
    assert {(t.get_ha(), t.get_va(), t.get_fontsize()) for t in texts} == {("center", "center", 8)}
    colour = {t.get_text(): t.get_color() for t in texts}
    assert colour["30.0"] == "white" and colour["90.0"] == "black"                      # dark vs light viridis
    unitless = _figure(RANKING, "movielens__naive__ndcg@10__matrix.png").axes[0]
    assert "0.450" in {t.get_text() for t in unitless.texts}                           # CI/2, no x100
    pct = _figure(RANKING, "movielens__naive__hit@10__matrix.png").axes[0].images[0].get_array()
    assert pct[0, 0] == pytest.approx(100 * (0.9 + 1.0) / 2)
    R = np.linspace(0, 1, 25).reshape(5, 5)
    ax = report.heatmap_figure("t", R, ACCURACY, mask_unseen=False).axes[0]
    image = ax.images[0]
    for t in ax.texts:
        j, i = t.get_position()
        r, g, b, _ = image.cmap(image.norm(100 * R[i, j]))
        assert t.get_color() == ("black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"), (i, j)
    assert len(ax.texts) == 25


def test_a_cell_of_luminance_exactly_one_half_gets_white_text():
    """The text turns black only above luminance 0.5: a cell coloured (1, g, 0) with 0.299 + 0.587 g = 0.5 exactly
    in float64 gets white text, g + 1e-9 black. Catches ``>=`` for ``>`` at the boundary."""
    g = 0.34241908006814314
    assert 0.299 * 1.0 + 0.587 * g + 0.114 * 0.0 == 0.5
    colours = []
    for green in (g, g + 1e-9):
        fig, ax = plt.subplots()
        image = SimpleNamespace(cmap=lambda v, green=green: (1.0, green, 0.0, 1.0), norm=lambda v: v)
        report._annotate(ax, np.ma.masked_array([[0.5]]), image, 1)
        colours += [t.get_color() for t in ax.texts]
    assert colours == ["white", "black"]


def test_large_matrices_are_coloured_without_values_on_smaller_cells():
    """Up to 20 experiences every cell is annotated at 0.55 in; from 21 on no values and 8/T in per cell, ticks
    every other step. Catches a wrong threshold or an unreadable wall of numbers."""
    fig = report.heatmap_figure("t", np.full((20, 20), 0.5), ACCURACY, mask_unseen=True)
    assert len(fig.axes[0].texts) == 210 and tuple(fig.get_size_inches()) == pytest.approx((13.4, 12.3))
    fig = report.heatmap_figure("t", np.full((21, 21), 0.5), ACCURACY, mask_unseen=True)
    ax = fig.axes[0]
    assert not ax.texts and tuple(fig.get_size_inches()) == pytest.approx((10.4, 9.3))
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in range(1, 22, 2)]
    np.testing.assert_array_equal(ax.get_yticks(), np.arange(0, 21, 2))
