"""clbench.analysis.stability: the statistics by hand on small curves, the refusals, and the reading of a results
folder's per-epoch training logs."""

import json
import math

import pytest

from clbench.analysis.stability import row_stability, training_loss_curves


def test_statistics_by_hand():
    """Seed 1 falls at a constant rate (roughness 0, no reversal); seed 2 zig-zags down (second differences 3 and
    3; one of its three moves goes up)."""
    smooth, zigzag = [4.0, 3.0, 2.0, 1.0], [4.0, 2.0, 3.0, 1.0]
    s = row_stability([smooth, zigzag])
    assert (s.seeds, s.epochs) == (2, 4)
    # std over 2 seeds of (4,4), (3,2), (2,3), (1,1): 0, √0.5, √0.5, 0
    assert s.seed_spread == pytest.approx(2 * math.sqrt(0.5) / 4)
    # zigzag: |3 - 4 + 4| = 3, |1 - 6 + 2| = 3 -> mean 3; smooth 0 -> row 1.5
    assert s.roughness == pytest.approx(1.5)
    assert s.reversals == pytest.approx((0 + 1 / 3) / 2)
    assert s.final_spread == 0.0


@pytest.mark.parametrize("curves", [[[1.0, 2.0, 3.0]], [[1.0, 2.0], [1.0, 2.0]], [[1.0, 2.0, 3.0], [1.0, 2.0]]])
def test_too_few_seeds_or_epochs_or_unequal_budgets_are_refused(curves):
    with pytest.raises(ValueError, match="at least 2 curves of one length"):
        row_stability(curves)


def test_reads_one_curve_per_seed_from_the_training_logs(tmp_path):
    for seed, losses in enumerate(([3.0, 2.0, 1.5], [3.5, 2.5, 1.0])):
        run = tmp_path / "artifacts" / f"games__dp__s{seed}"
        run.mkdir(parents=True)
        (run / "training_log.jsonl").write_text("".join(
            json.dumps({"member": "", "experience": 0, "epoch": e, "loss": x}) + "\n" for e, x in enumerate(losses)))
    assert training_loss_curves(tmp_path, "dp", "games") == [[3.0, 2.0, 1.5], [3.5, 2.5, 1.0]]
    with pytest.raises(FileNotFoundError, match="no games__other__s"):
        training_loss_curves(tmp_path, "other", "games")
    (tmp_path / "artifacts" / "games__dp__s1" / "training_log.jsonl").write_text(
        json.dumps({"member": "", "experience": 1, "epoch": 0, "loss": 1.0}) + "\n")
    with pytest.raises(ValueError, match="not one experience's epochs"):
        training_loss_curves(tmp_path, "dp", "games")
