"""Leaderboard aggregation: one row per run identity, mean and sample std over seeds, sorted by the primary metric."""

import json
import math

import pandas as pd
import pytest

from clbench import leaderboard


def _record(strategy, seed, avg, last, status="finished", extra=None, args=None, label="", code="c" * 16):
    args = args or {}
    return {"run_id": f"synthetic__{label or strategy}__s{seed}",
            "spec": {"suite": "s", "scenario": {"name": "synthetic", "label": "", "args": {}},
                     "strategy": {"name": strategy, "label": label, "preset": "cpu", "args": args}},
            "strategy_config": {"epochs": 2, **args}, "code_fingerprint": code,
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
    assert math.isnan(table.loc["replay", "avg_inc_acc_std"])                  # one seed: no std
    assert table.loc["replay", "epsilon"] == pytest.approx(3.0)
    assert math.isnan(table.loc["naive", "epsilon"])
    required = {"suite", "scenario", "strategy", "n_seeds", "avg_inc_acc", "avg_inc_acc_std", "last_acc",
                "last_acc_std", "forgetting", "bwt", "params_M", "params_added_M", "train_s", "peak_mem_MB",
                "overrides", "code_fingerprint"}
    assert required <= set(table.reset_index().columns)


def test_rows_split_by_identity_and_labelled_by_the_differing_keys():
    records = [_record("replay", 0, 70.0, 60.0, args={"mem_size": 200}),
               _record("replay", 1, 50.0, 40.0, args={"mem_size": 20}),
               _record("replay", 2, 72.0, 62.0, args={"mem_size": 200}),
               _record("naive", 0, 40.0, 20.0), _record("naive", 1, 41.0, 21.0, code="d" * 16)]
    table = leaderboard.build(records).set_index("strategy")
    assert table.loc["replay [mem_size=200]", "n_seeds"] == 2
    assert table.loc["replay [mem_size=200]", "avg_inc_acc"] == pytest.approx(71.0)
    assert table.loc["replay [mem_size=20]", "n_seeds"] == 1
    assert table.loc["naive [code=ccccccc]", "n_seeds"] == table.loc["naive [code=ddddddd]", "n_seeds"] == 1


def test_markdown_has_suite_and_overrides_and_sorts_by_the_primary_metric(tmp_path):
    records = [_record("naive", 0, 40.0, 20.0), _record("naive", 1, 50.0, 30.0),
               _record("replay", 0, 70.0, 60.0, args={"mem_size": 200, "model_args": {"hidden": [8]}}),
               _record("joint", 0, None, 95.0)]                                 # avg undefined: sorted by last
    (tmp_path / "runs").mkdir()
    for r in records:
        (tmp_path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    table = leaderboard.write(tmp_path)
    assert list(table["strategy"]) == ["joint", "replay", "naive"]
    md = (tmp_path / "leaderboard.md").read_text().splitlines()
    assert md[2].startswith("| suite | scenario | strategy | preset | overrides | seeds | avg_inc_acc |")
    assert md[4].startswith("| s | synthetic | joint | cpu | – | 1 | – | 95.00 ± – |")
    assert md[5].startswith("| s | synthetic | replay | cpu | mem_size=200, model_args={hidden: [8]} | 1 | 70.00 ± – |")
    assert md[6].startswith("| s | synthetic | naive | cpu | – | 2 | 45.00 ± 7.07 | 25.00 ± 7.07 |")
    assert "Machine: cpu: test" in md[-1]
    csv = pd.read_csv(tmp_path / "leaderboard.csv")
    assert list(csv["strategy"]) == ["joint", "replay", "naive"] and csv["avg_inc_acc"][2] == pytest.approx(45.0)
    assert pd.isna(csv["avg_inc_acc_std"][1])


def test_missing_runs_folder_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="run a suite first"):
        leaderboard.load_records(tmp_path)
