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


@pytest.mark.parametrize("curves", [[], [[1.0, 2.0], [1.0, 2.0]], [[1.0, 2.0, 3.0], [1.0, 2.0]]])
def test_no_curve_too_few_epochs_or_unequal_budgets_are_refused(curves):
    with pytest.raises(ValueError, match="curves of one length of at least 3"):
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


def test_one_curve_has_no_spread_across_seeds():
    s = row_stability([[4.0, 2.0, 3.0, 1.0]])
    assert (s.seeds, s.seed_spread, s.final_spread) == (1, None, None)
    assert (s.roughness, s.reversals) == (3.0, pytest.approx(1 / 3))


def _course(path, row: str, seed: int, values, trajectory: bool = True, step: int = 0, metric: str = "ndcg@10",
            header: str = "# benchmarks/budget_curve.py ...\n") -> None:
    lines = [json.dumps({"event": "epoch", "scenario": "games", "row": row, "seed": seed, "step": step,
                         "epoch": e, "metric": metric, "holdout": "valid", "just_trained": x, "seen": -1.0,
                         "trajectory": trajectory}) for e, x in enumerate(values, 1)]
    path.write_text(header + "\n".join(lines) + "\n| epoch | table |\n|---|---|\n")


def test_validation_curves_group_rows_over_seeds_from_trajectory_files(tmp_path):
    """Every row of the files, one curve per seed in seed order, read from ``just_trained`` (``seen`` is not the
    curve); the table and header lines are not read."""
    from clbench.analysis.stability import validation_curves

    _course(tmp_path / "a1.txt", "a", 1, [0.3, 0.2, 0.1])
    _course(tmp_path / "a0.txt", "a", 0, [0.1, 0.2, 0.3])
    _course(tmp_path / "b0.txt", "b", 0, [0.5, 0.5, 0.4])
    assert validation_curves([tmp_path / "a1.txt", tmp_path / "b0.txt", tmp_path / "a0.txt"]) == {
        ("games", "a"): [[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]], ("games", "b"): [[0.5, 0.5, 0.4]]}


@pytest.mark.parametrize("write, message", [
    (lambda p: _course(p, "a", 0, [0.1, 0.2, 0.3], trajectory=False), "not a trajectory"),
    (lambda p: _course(p, "a", 0, [0.1, 0.2, 0.3], step=1), "step 1: a validation course is read on a one-step"),
    (lambda p: _course(p, "a", 0, [0.1, 0.2, 0.3], header='{"event": "epoch", "cut\n'), "not a JSON line"),
    (lambda p: p.write_text("# only a header\n"), "no epoch line"),
])
def test_validation_curves_refuse_what_is_not_one_runs_course(tmp_path, write, message):
    from clbench.analysis.stability import validation_curves

    write(tmp_path / "x.txt")
    with pytest.raises(ValueError, match=message):
        validation_curves([tmp_path / "x.txt"])


def test_validation_curves_refuse_a_seed_twice_a_gap_and_two_metrics(tmp_path):
    from clbench.analysis.stability import validation_curves

    _course(tmp_path / "a.txt", "a", 0, [0.1, 0.2, 0.3])
    _course(tmp_path / "again.txt", "a", 0, [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="seed 0 of row 'a' on 'games' is also in another file"):
        validation_curves([tmp_path / "a.txt", tmp_path / "again.txt"])
    lines = (tmp_path / "a.txt").read_text().splitlines()
    (tmp_path / "gap.txt").write_text("\n".join(lines[:2] + lines[3:]))                # epoch 2 missing
    with pytest.raises(ValueError, match=r"epochs \[1, 3\], not 1..E in order"):
        validation_curves([tmp_path / "gap.txt"])
    _course(tmp_path / "acc.txt", "a", 1, [1.0, 2.0, 3.0], metric="accuracy")
    with pytest.raises(ValueError, match="several metrics"):
        validation_curves([tmp_path / "a.txt", tmp_path / "acc.txt"])


def test_stability_command_reads_curve_files(tmp_path, capsys):
    from clbench.cli import main

    _course(tmp_path / "a0.txt", "a", 0, [4.0, 3.0, 2.0, 1.0])
    _course(tmp_path / "a1.txt", "a", 1, [4.0, 2.0, 3.0, 1.0])
    _course(tmp_path / "b0.txt", "b", 0, [4.0, 2.0, 3.0, 1.0])
    files = [str(tmp_path / f) for f in ("a0.txt", "a1.txt", "b0.txt")]
    assert main(["analyze", "stability", "--curves", *files, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "stability.csv").read_text().splitlines() == [
        "scenario,row,seeds,epochs,seed_spread,roughness,reversals,final_spread",
        f"games,a,2,4,{2 * math.sqrt(0.5) / 4:.3g},1.5,{(1 / 3) / 2:.3g},0",
        f"games,b,1,4,,3,{1 / 3:.3g},"]
    capsys.readouterr()
    for wrong in (["--curves", *files], ["--curves", *files, "--out", "o", "--rows", "a"],
                  ["--curves", *files, "--out", "o", "--run", str(tmp_path)], ["--rows", "a"]):
        assert main(["analyze", "stability", *wrong]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    _course(tmp_path / "short.txt", "a", 2, [4.0, 3.0, 2.0])                        # a 3-epoch run of row a
    assert main(["analyze", "stability", "--curves", *files[:2], str(tmp_path / "short.txt"), "--out", "o"]) == 2
    assert "row 'a' on 'games': stability needs curves of one length" in capsys.readouterr().err
