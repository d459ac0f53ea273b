import numpy as np
import pytest

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
