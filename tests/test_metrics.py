import numpy as np
import pytest

from clbench.metrics import seen_accuracy, summarize

# 3 steps, test sizes 10 / 20 / 30. Row i = after training step i.
R = [[0.9, 0.0, 0.0],
     [0.6, 0.8, 0.0],
     [0.5, 0.7, 0.9]]
SIZES = [10, 20, 30]


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
    assert m["fwt"] is None


def test_fwt_with_reference():
    m = summarize(R, SIZES, fwt_reference=[0.1, 0.1, 0.1])
    assert m["fwt"] == pytest.approx(100 * ((0.0 - 0.1) + (0.0 - 0.1)) / 2)


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
