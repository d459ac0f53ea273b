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


def _record(label: str, seed: int, scenario: str = "games", status: str = "finished") -> dict:
    return {"run_id": f"{scenario}__{label}__s{seed}", "status": status, "seed": seed,
            "spec": {"suite": "t", "scenario": {"name": scenario, "label": ""},
                     "strategy": {"name": "x", "label": label}}, "metrics": {"last_acc": 1.0}}


def _log(folder, run_id: str, losses, experience: int = 0) -> None:
    run = folder / "artifacts" / run_id
    run.mkdir(parents=True, exist_ok=True)
    (run / "training_log.jsonl").write_text("".join(
        json.dumps({"member": "", "experience": experience, "epoch": e, "loss": x}) + "\n"
        for e, x in enumerate(losses)))


def test_reads_one_curve_per_finished_seed_of_the_records_given(tmp_path):
    """Only the logs of the records given (checked on read by the caller) are read: a log left by a refused or
    replaced record (here seed 2's, whose record is not given) and a failed seed's are not curves."""
    for seed, losses in enumerate(([3.0, 2.0, 1.5], [3.5, 2.5, 1.0], [9.0, 9.0, 9.0])):
        _log(tmp_path, f"games__dp__s{seed}", losses)
    records = [_record("dp", 1), _record("dp", 0), _record("dp", 3, status="failed"), _record("other", 0)]
    assert training_loss_curves(records, tmp_path, "dp", "games") == [[3.0, 2.0, 1.5], [3.5, 2.5, 1.0]]
    with pytest.raises(FileNotFoundError, match="no finished run of row 'absent'"):
        training_loss_curves(records, tmp_path, "absent", "games")
    with pytest.raises(FileNotFoundError, match="games__other__s0/training_log.jsonl: missing"):
        training_loss_curves(records, tmp_path, "other", "games")
    _log(tmp_path, "games__dp__s1", [1.0], experience=1)
    with pytest.raises(ValueError, match="not one experience's epochs"):
        training_loss_curves(records, tmp_path, "dp", "games")


def test_stability_command_writes_the_table_from_checked_records_only(tmp_path, capsys):
    """The command reads the folder's records through the check on read: an edited record is skipped (said), and
    its log is not read."""
    from clbench.cli import main
    from tests._records import sealed

    (tmp_path / "runs").mkdir()
    for seed, losses in enumerate(([4.0, 3.0, 2.0, 1.0], [4.0, 2.0, 3.0, 1.0], [0.0, 50.0, 0.0, 50.0])):
        record = sealed(_record("dp", seed))
        _log(tmp_path, record["run_id"], losses)
        if seed == 2:
            record["metrics"]["last_acc"] = 99.0                        # edited after the run: refused on read
        (tmp_path / "runs" / f"{record['run_id']}.json").write_text(json.dumps(record))
    assert main(["analyze", "stability", "--run", str(tmp_path), "--rows", "dp"]) == 0
    assert "skipped:" in capsys.readouterr().out
    lines = (tmp_path / "stability.csv").read_text().splitlines()
    assert lines == ["scenario,row,seeds,epochs,seed_spread,roughness,reversals,final_spread",
                     f"games,dp,2,4,{2 * math.sqrt(0.5) / 4:.3g},1.5,{(1 / 3) / 2:.3g},0"]
    assert main(["analyze", "stability", "--run", str(tmp_path), "--rows", "nope"]) == 2
    assert main(["analyze", "stability", "--run", str(tmp_path)]) == 2
