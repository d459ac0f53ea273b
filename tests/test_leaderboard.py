"""Leaderboard aggregation: one row per (suite, scenario, strategy), mean and sample std over seeds."""

import math

import pandas as pd
import pytest

from clbench import leaderboard


def _record(strategy, seed, avg, last, status="finished", extra=None):
    return {"spec": {"suite": "s", "scenario": {"name": "synthetic", "label": ""},
                     "strategy": {"name": strategy, "label": "", "preset": "cpu"}},
            "seed": seed, "status": status, "env": {"machine": "cpu: test"},
            "metrics": {} if status != "finished" else {
                "avg_inc_acc": avg, "last_acc": last, "forgetting": 10.0, "bwt": -5.0, "fwt": None,
                "params_M": 1.0, "params_added_M": 0.5, "trainable_params_M": 1.0, "train_s": 2.0, "eval_s": 1.0,
                "peak_mem_MB": 3.0, "extra": extra or {}}}


def test_mean_and_std_over_seeds():
    records = [_record("naive", 0, 40.0, 20.0), _record("naive", 1, 50.0, 30.0), _record("naive", 2, 60.0, 40.0),
               _record("replay", 0, 70.0, 60.0, extra={"epsilon": 3.0}),
               _record("replay", 1, 0, 0, status="failed")]
    table = leaderboard.build(records).set_index("strategy")
    assert table.loc["naive", "n_seeds"] == 3 and table.loc["naive", "n_failed"] == 0
    assert table.loc["naive", "avg_inc_acc"] == pytest.approx(50.0)
    assert table.loc["naive", "avg_inc_acc_std"] == pytest.approx(10.0)       # sample std of 40/50/60
    assert table.loc["naive", "last_acc_std"] == pytest.approx(10.0)
    assert table.loc["replay", "n_seeds"] == 1 and table.loc["replay", "n_failed"] == 1
    assert table.loc["replay", "avg_inc_acc_std"] == 0.0
    assert table.loc["replay", "epsilon"] == pytest.approx(3.0)
    assert math.isnan(table.loc["naive", "epsilon"])
    required = {"suite", "scenario", "strategy", "n_seeds", "avg_inc_acc", "avg_inc_acc_std", "last_acc",
                "last_acc_std", "forgetting", "bwt", "params_M", "params_added_M", "train_s", "peak_mem_MB"}
    assert required <= set(table.reset_index().columns)


def test_write_csv_and_markdown(tmp_path):
    import json

    (tmp_path / "runs").mkdir()
    for i, r in enumerate([_record("naive", 0, 40.0, 20.0), _record("naive", 1, 50.0, 30.0)]):
        (tmp_path / "runs" / f"r{i}.json").write_text(json.dumps(r))
    leaderboard.write(tmp_path)
    csv = pd.read_csv(tmp_path / "leaderboard.csv")
    assert list(csv["strategy"]) == ["naive"] and csv["avg_inc_acc"][0] == pytest.approx(45.0)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "45.00 ± 7.07" in md and "Machine: cpu: test" in md


def test_missing_runs_folder_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="run a suite first"):
        leaderboard.load_records(tmp_path)
