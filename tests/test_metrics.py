"""The metrics of an accuracy matrix (:mod:`clbench.metrics`), by hand and as properties.

Property-based tests (hypothesis) of the metrics and the leaderboard: for random valid accuracy matrices and run
sets, the invariants that follow from the definitions in README ("Metrics") and :mod:`clbench.metrics`:

    A_i = sum_{j<=i} R[i,j] n_j / sum_{j<=i} n_j,   avg_inc = mean_i A_i,   last = A_{T-1},
    forgetting = mean_{j<T-1} (max_{i<T-1} R[i,j] - R[T-1,j]),   bwt = mean_{j<T-1} (R[T-1,j] - R[j,j]),

``%`` metrics reported ×100. Each test's docstring states the invariant it checks."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clbench import metrics
from clbench.metrics import ACCURACY, MetricSpec, seen_accuracy, summarize_matrix

# 3 steps, test sizes 10 / 20 / 30. Row i = after training step i.
R = [[0.9, 0.0, 0.0],
     [0.6, 0.8, 0.0],
     [0.5, 0.7, 0.9]]
SIZES = [10, 20, 30]


def summarize(matrix, sizes, **kw):          # the accuracy matrix alone, as the runner summarizes it
    return summarize_matrix(matrix, sizes, ACCURACY, **kw)


def test_summary_against_hand_computation():
    m = summarize(R, SIZES)
    a0 = 0.9
    a1 = (0.6 * 10 + 0.8 * 20) / 30
    a2 = (0.5 * 10 + 0.7 * 20 + 0.9 * 30) / 60
    assert m["avg_inc_acc"] == pytest.approx(100 * (a0 + a1 + a2) / 3)
    assert m["last_acc"] == pytest.approx(100 * a2)
    # forgetting: j=0: max(0.9, 0.6) - 0.5 = 0.4; j=1: max(0.0, 0.8) - 0.7 = 0.1
    assert m["forgetting"] == pytest.approx(100 * (0.4 + 0.1) / 2)
    # bwt: (0.5 - 0.9 + 0.7 - 0.8) / 2
    assert m["bwt"] == pytest.approx(100 * (-0.4 - 0.1) / 2)
    assert set(m) == {"avg_inc_acc", "last_acc", "forgetting", "bwt"}      # no always-empty fwt column


def test_lower_is_better_metric_forgets_upwards_and_keeps_its_unit():
    """A loss-like metric (lower is better): forgetting is how far the last row rose above the best (lowest) earlier
    value; no ×100 without the % unit; columns are named <metric>_<summary>."""
    loss = MetricSpec("nll", higher_is_better=False)
    m = summarize_matrix([[2.0, 5.0], [3.5, 1.0]], [10, 30], loss)
    assert m["nll_forgetting"] == pytest.approx(3.5 - 2.0)
    assert m["nll_bwt"] == pytest.approx(3.5 - 2.0)
    assert m["nll_last"] == pytest.approx((3.5 * 10 + 1.0 * 30) / 40)
    assert m["nll_avg_inc"] == pytest.approx((2.0 + (3.5 * 10 + 1.0 * 30) / 40) / 2)


def test_summarize_needs_a_matrix_per_spec_and_joins_their_columns():
    ndcg, hit = MetricSpec("ndcg@10", primary=True), MetricSpec("hit@10")
    m = metrics.summarize({"ndcg@10": [[0.5]], "hit@10": [[0.75]]}, [4], [ndcg, hit])
    assert m["ndcg@10_last"] == 0.5 and m["hit@10_last"] == 0.75
    with pytest.raises(ValueError, match="no matrix for metric"):
        metrics.summarize({"ndcg@10": [[0.5]]}, [4], [ndcg, hit])


def test_task_incremental_matrix_nonzero_upper_triangle():
    # task-IL accuracies of unseen tasks can be above zero; forgetting takes the max over all earlier rows
    r = [[0.8, 0.5], [0.9, 0.7]]
    m = summarize(r, [10, 10])
    assert m["forgetting"] == pytest.approx(100 * (0.8 - 0.9))  # negative forgetting: it improved
    assert m["bwt"] == pytest.approx(100 * (0.9 - 0.8))
    assert m["avg_inc_acc"] == pytest.approx(100 * (0.8 + 0.8) / 2)


def test_offline_run_has_only_last_acc():
    m = summarize([[0.5, 1.0]], [10, 30], offline=True)
    assert m["last_acc"] == pytest.approx(100 * (5 + 30) / 40)
    assert m["avg_inc_acc"] is None and m["forgetting"] is None and m["bwt"] is None


def test_single_step_has_no_forgetting():
    m = summarize([[0.7]], [5])
    assert m["last_acc"] == pytest.approx(70.0) and m["forgetting"] is None


def test_seen_accuracy_weights_by_size():
    assert seen_accuracy(np.asarray(R), SIZES, 1) == pytest.approx((6 + 16) / 30)


@pytest.mark.parametrize("bad, match", [([[1.2]], r"\[0, 1\]"), ([[0.1, 0.2]], "square"), ([[]], "2-D")])
def test_malformed_matrices_are_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        summarize(bad, [1] * max(1, len(bad[0])))


def test_primary_is_the_marked_spec_else_the_first():
    a, b = MetricSpec("a"), MetricSpec("b")
    assert metrics.primary([a, b]) is a
    assert metrics.primary([a, MetricSpec("c", primary=True)]).name == "c"


def test_metric_spec_round_trips_through_its_dict():
    """What a record stores (``metric_specs``) reads back as the same spec (the leaderboard and plots rebuild it)."""
    assert MetricSpec(**ACCURACY.to_dict()) == ACCURACY
    assert ACCURACY.to_dict()["columns"]["last"] == "last_acc"


def test_summarize_passes_offline_on():
    """An offline run through ``summarize`` (the runner's entry point): one row, only the last columns."""
    m = metrics.summarize({"accuracy": [[0.5, 1.0]]}, [10, 30], [ACCURACY], offline=True)
    assert m == {"avg_inc_acc": None, "last_acc": pytest.approx(100 * 35 / 40), "forgetting": None, "bwt": None}


def test_boolean_and_integer_matrices_are_read_as_float_fractions():
    """Entries of any real type are read as float64: a 0/1 (correct/incorrect) matrix summarizes like its floats."""
    as_bool = summarize([[True, False], [False, True]], [1, 3])
    assert as_bool == summarize([[1.0, 0.0], [0.0, 1.0]], [1, 3])
    assert as_bool["forgetting"] == pytest.approx(100.0) and as_bool["last_acc"] == pytest.approx(75.0)


# 60 examples per test; `make mutation` runs each mutant's tests with fewer (tests/mutation_report.py)
PROFILE = settings(max_examples=int(os.environ.get("CLBENCH_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
                   derandomize=True)


UNITLESS = MetricSpec("score")


LOSS = MetricSpec("loss", higher_is_better=False)


@st.composite
def runs(draw, low: float = 0.0, high: float = 1.0, min_t: int = 1):
    """``(R, sizes)``: a ``T x T`` matrix of entries in ``[low, high]`` and ``T`` test sizes >= 1."""
    t = draw(st.integers(min_t, 6))
    values = st.floats(low, high, allow_nan=False, allow_infinity=False)
    R = np.array(draw(st.lists(st.lists(values, min_size=t, max_size=t), min_size=t, max_size=t)))
    sizes = draw(st.lists(st.integers(1, 1000), min_size=t, max_size=t))
    return R, sizes


def _seen(R, sizes, i):
    n = np.asarray(sizes[: i + 1], dtype=float)
    return float((R[i, : i + 1] * n).sum() / n.sum())


@PROFILE
@given(runs())
def test_last_is_the_test_size_weighted_mean_of_the_last_row_and_avg_inc_the_mean_of_the_A_i(run):
    """last_acc = 100 sum_j R[T-1,j] n_j / sum_j n_j; avg_inc_acc = 100 mean_i A_i with A_i over the seen
    experiences j <= i; with T = 1 forgetting and bwt are undefined (None)."""
    R, sizes = run
    T = len(sizes)
    m = summarize_matrix(R.tolist(), sizes, ACCURACY)
    assert m["last_acc"] == pytest.approx(100 * np.average(R[-1], weights=sizes), abs=1e-9)
    assert m["avg_inc_acc"] == pytest.approx(100 * np.mean([_seen(R, sizes, i) for i in range(T)]), abs=1e-9)
    assert 0 <= m["last_acc"] <= 100 + 1e-9 and 0 <= m["avg_inc_acc"] <= 100 + 1e-9
    if T == 1:
        assert m["forgetting"] is None and m["bwt"] is None
    else:
        old = range(T - 1)
        assert m["forgetting"] == pytest.approx(100 * np.mean([R[:-1, j].max() - R[-1, j] for j in old]), abs=1e-9)
        assert m["bwt"] == pytest.approx(100 * np.mean([R[-1, j] - R[j, j] for j in old]), abs=1e-9)


@PROFILE
@given(runs(high=0.5, min_t=2), st.floats(0.0, 0.5))
def test_adding_a_constant_shifts_the_accuracies_and_leaves_forgetting_and_bwt(run, c):
    """R + c: avg_inc_acc and last_acc move by 100 c; forgetting and bwt (differences of entries) do not move."""
    R, sizes = run
    a, b = summarize_matrix(R.tolist(), sizes), summarize_matrix((R + c).tolist(), sizes)
    assert b["avg_inc_acc"] == pytest.approx(a["avg_inc_acc"] + 100 * c, abs=1e-7)
    assert b["last_acc"] == pytest.approx(a["last_acc"] + 100 * c, abs=1e-7)
    assert b["forgetting"] == pytest.approx(a["forgetting"], abs=1e-7)
    assert b["bwt"] == pytest.approx(a["bwt"], abs=1e-7)


@PROFILE
@given(runs(-5.0, 5.0, min_t=2), st.integers(2, 50))
def test_scaling_every_test_size_changes_nothing_and_unitless_metrics_are_not_scaled(run, k):
    """The weights n_j enter only relative to each other: k n_j gives the same summaries. A metric without the
    ``%`` unit is reported as is (no ×100) and may take any finite value."""
    R, sizes = run
    a = summarize_matrix(R.tolist(), sizes, UNITLESS)
    b = summarize_matrix(R.tolist(), [k * n for n in sizes], UNITLESS)
    assert a.keys() == b.keys() == {"score_avg_inc", "score_last", "score_forgetting", "score_bwt"}
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-9)
    assert a["score_last"] == pytest.approx(np.average(R[-1], weights=sizes), abs=1e-9)


@PROFILE
@given(runs(min_t=2), st.randoms(use_true_random=False))
def test_relabelling_the_old_experiences_changes_no_summary_but_avg_inc(run, rnd):
    """Permuting the old experiences j < T-1 (their columns, their rows as the step that trained them, and their
    test sizes, all with one permutation) keeps last (a weighted mean over all columns), forgetting (a mean over
    the old columns of a max over the old rows) and bwt (a mean of R[T-1,j] - R[j,j]) unchanged."""
    R, sizes = run
    T = len(sizes)
    perm = list(range(T - 1))
    rnd.shuffle(perm)
    order = [*perm, T - 1]
    P = R[np.ix_(order, order)]
    a = summarize_matrix(R.tolist(), sizes)
    b = summarize_matrix(P.tolist(), [sizes[j] for j in order])
    for key in ("last_acc", "forgetting", "bwt"):
        assert b[key] == pytest.approx(a[key], abs=1e-9)


@PROFILE
@given(runs(min_t=2))
def test_forgetting_bounds_minus_bwt_and_is_the_mirror_image_for_lower_is_better_metrics(run):
    """forgetting >= -bwt (the max over earlier rows is at least the diagonal entry); for a lower-is-better metric,
    forgetting of R equals forgetting of -R as a higher-is-better one (min instead of max, sign flipped), and bwt
    keeps its definition R[T-1,j] - R[j,j]."""
    R, sizes = run
    m = summarize_matrix(R.tolist(), sizes, UNITLESS)
    assert m["score_forgetting"] >= -m["score_bwt"] - 1e-12
    lower = summarize_matrix(R.tolist(), sizes, LOSS)
    mirrored = summarize_matrix((-R).tolist(), sizes, UNITLESS)
    assert lower["loss_forgetting"] == pytest.approx(mirrored["score_forgetting"], abs=1e-12)
    assert lower["loss_bwt"] == pytest.approx(m["score_bwt"], abs=1e-12)
    assert lower["loss_last"] == pytest.approx(m["score_last"], abs=1e-12)


@PROFILE
@given(runs(min_t=2))
def test_an_offline_run_defines_only_last_over_every_experience(run):
    """An offline (joint) run's single row, evaluated after training on everything: last = the weighted mean of
    that row over all T experiences; avg_inc, forgetting and bwt are None. Several rows are refused."""
    R, sizes = run
    m = summarize_matrix(R[-1:].tolist(), sizes, offline=True)
    assert m["last_acc"] == pytest.approx(100 * np.average(R[-1], weights=sizes), abs=1e-9)
    assert m["avg_inc_acc"] is None and m["forgetting"] is None and m["bwt"] is None
    with pytest.raises(ValueError, match=r"^an offline run has exactly one row \(evaluated once, after training on "
                                         r"everything\)\.$"):
        summarize_matrix(R.tolist(), sizes, offline=True)


@PROFILE
@given(runs(), st.integers(-3, 3).filter(lambda d: d != 0))
def test_a_wrong_number_of_test_sizes_is_refused_with_one_line(run, d):
    """len(test_sizes) must be T: any other count is a ValueError saying both numbers."""
    R, sizes = run
    T = len(sizes)
    wrong = (sizes * 2)[: max(0, T + d)]
    with pytest.raises(ValueError, match=rf"^{len(wrong)} test sizes for {T} test experiences\.$"):
        summarize_matrix(R.tolist(), wrong)


@pytest.mark.parametrize("matrix, offline, message", [
    ([[0.5, 0.5]], False, r"^accuracy matrix must be square \(one row per training step\), got \(1, 2\)\.$"),
    ([[0.5], [0.5]], False, r"^accuracy matrix must be square \(one row per training step\), got \(2, 1\)\.$"),
    ([0.5, 0.5], False, r"^accuracy matrix must be 2-D with at least one column, got shape \(2,\)\.$"),
    ([[]], False, r"^accuracy matrix must be 2-D with at least one column, got shape \(1, 0\)\.$"),
    ([[float("nan")]], False, r"^accuracy matrix has non-finite entries\.$"),
    ([[float("inf")]], True, r"^accuracy matrix has non-finite entries\.$"),
    ([[1.0001]], False, r"^accuracy matrix entries must be fractions in \[0, 1\]\.$"),
    ([[-0.0001]], False, r"^accuracy matrix entries must be fractions in \[0, 1\]\.$"),
])
def test_malformed_matrices_are_refused_with_one_line(matrix, offline, message):
    """Each malformed matrix is a ValueError whose one line names the metric and what is wrong (exact text: the
    messages are the interface)."""
    sizes = [1] * (len(matrix[0]) if isinstance(matrix[0], list) and matrix[0] else 1)
    with pytest.raises(ValueError, match=message):
        summarize_matrix(matrix, sizes, ACCURACY, offline=offline)


def test_boundary_fractions_and_unbounded_unitless_scores_are_accepted():
    """0 and 1 are valid fractions; a unitless metric has no range."""
    assert summarize_matrix([[0.0, 1.0], [1.0, 0.0]], [1, 1])["last_acc"] == pytest.approx(50.0)
    assert summarize_matrix([[-2.0]], [1], UNITLESS)["score_last"] == -2.0


@PROFILE
@given(runs(), runs())
def test_summarize_is_the_union_of_each_specs_summaries(a, b):
    """summarize over several specs = the per-spec summaries side by side (one matrix each, shared test sizes);
    a missing matrix is refused, naming it."""
    R, sizes = a
    S = b[0][: len(sizes), : len(sizes)]
    if S.shape != R.shape:
        S = R[::-1, ::-1].copy()
    hit = MetricSpec("hit@10")
    both = metrics.summarize({"accuracy": R.tolist(), "hit@10": S.tolist()}, sizes, [ACCURACY, hit])
    assert both == {**summarize_matrix(R.tolist(), sizes, ACCURACY), **summarize_matrix(S.tolist(), sizes, hit)}
    with pytest.raises(ValueError, match=r"^no matrix for metric\(s\) \['hit@10'\]; got \['accuracy'\]\.$"):
        metrics.summarize({"accuracy": R.tolist()}, sizes, [ACCURACY, hit])
