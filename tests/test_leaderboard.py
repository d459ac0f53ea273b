"""Leaderboard aggregation: one row per run identity, mean and sample std over seeds, sorted by the primary metric."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import adequacy, leaderboard
from tests._cli import run_suite
from tests._records import sealed


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
    for r in map(sealed, records):
        (tmp_path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    table = leaderboard.write(tmp_path)
    assert list(table["strategy"]) == ["joint", "replay", "naive"]
    md = (tmp_path / "leaderboard.md").read_text().splitlines()
    assert md[2].startswith("| suite | scenario | strategy | preset | overrides | seeds | avg_inc_acc |")
    assert md[4].startswith("| s | synthetic | joint | cpu | – | 1 | – | 95.00 (n=1) |")
    assert md[5].startswith("| s | synthetic | replay | cpu | mem_size=200, model_args={hidden: [8]} | 1 "
                            "| 70.00 (n=1) |")
    assert md[6].startswith("| s | synthetic | naive | cpu | – | 2 | 45.00 ± 7.07 | 25.00 ± 7.07 |")
    assert "Machine: cpu: test" in md[-1]
    csv = pd.read_csv(tmp_path / "leaderboard.csv")
    assert list(csv["strategy"]) == ["joint", "replay", "naive"] and csv["avg_inc_acc"][2] == pytest.approx(45.0)
    assert pd.isna(csv["avg_inc_acc_std"][1])


def test_missing_runs_folder_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="run a suite first"):
        leaderboard.load_records(tmp_path)


HEADER = ("| suite | scenario | strategy | preset | overrides | seeds | avg_inc_acc | last_acc | forgetting | bwt | "
          "params_M | params_added_M | train_s | peak_mem_MB |")


def test_markdown_is_exactly_title_header_rows_and_machines():
    """The whole markdown of a small table: title, header, separator, one row per identity (mean ± sample std,
    "(n=1)" instead of the std of one seed, "(N failed)" after the seed count, costs with their decimals, "|"
    escaped in a cell), then the legend and the machines."""
    records = [_record("naive", 0, 40.0, 20.0), _record("naive", 1, 50.0, 30.0),
               _record("naive", 2, 0, 0, status="failed"),
               _record("replay", 0, 70.0, 60.0, label="rp", args={"mem_size": 200, "tag": "a|b"})]
    records[-1]["env"]["machine"] = "gpu: other"
    records[-1]["metrics"].update(params_M=12.34567, params_added_M=0.0005, train_s=99.96, peak_mem_MB=None)
    md = leaderboard.to_markdown(leaderboard.build(records), "Title")
    assert md.splitlines() == [
        "# Title", "", HEADER, "|" + "---|" * 14,
        "| s | synthetic | rp | cpu | mem_size=200, tag=a\\|b | 1 | 70.00 (n=1) | 60.00 (n=1) | 10.00 (n=1) "
        "| -5.00 (n=1) "
        "| 12.346 | 0.001 | 100.0 | – |",
        "| s | synthetic | naive | cpu | – | 2 (1 failed) | 45.00 ± 7.07 | 25.00 ± 7.07 | 10.00 ± 0.00 | -5.00 ± 0.00 "
        "| 1.000 | 0.500 | 2.0 | 3.0 |",
        "", leaderboard.LEGEND, "", "Machine: cpu: test; gpu: other"]
    assert md.endswith("\n") and not md.endswith("\n\n")


def test_markdown_without_title_or_machines_and_an_all_failed_row():
    """No title line without a title; no machine line when no finished record has one; a row whose every seed
    failed shows 0 seeds, its failures and "–" everywhere."""
    records = [_record("naive", 0, 0, 0, status="failed"), _record("naive", 1, 0, 0, status="failed")]
    md = leaderboard.to_markdown(leaderboard.build(records)).splitlines()
    assert md == [HEADER, "|" + "---|" * 14,
                  "| s | synthetic | naive | cpu | – | 0 (2 failed) | – | – | – | – | – | – | – | – |", "",
                  leaderboard.LEGEND]


def test_every_column_is_the_mean_over_finished_seeds_with_stds_for_scores_only():
    records = [_record("naive", 0, 40.0, 20.0), _record("naive", 1, 50.0, 30.0)]
    records[1]["metrics"].update(forgetting=20.0, bwt=-7.0, trainable_params_M=3.0, eval_s=5.0, params_added_M=1.5)
    row = leaderboard.build(records).iloc[0]
    assert row["forgetting"] == pytest.approx(15.0) and row["forgetting_std"] == pytest.approx(7.0710678)
    assert row["bwt"] == pytest.approx(-6.0) and row["bwt_std"] == pytest.approx(1.4142136)
    assert row["trainable_params_M"] == pytest.approx(2.0) and row["eval_s"] == pytest.approx(3.0)
    assert row["params_added_M"] == pytest.approx(1.0) and row["train_s"] == pytest.approx(2.0)
    assert row["params_M"] == pytest.approx(1.0) and row["peak_mem_MB"] == pytest.approx(3.0)
    assert row["preset"] == "cpu" and row["overrides"] == "–" and row["machine"] == "cpu: test"
    assert row["code_fingerprint"] == "c" * 16 and row["primary_metric"] == "accuracy"
    assert "train_s_std" not in row and "params_M_std" not in row


def test_rows_are_ordered_by_suite_then_scenario_then_primary_metric_then_label():
    def rec(suite, scenario, strategy, avg, preset="cpu"):
        r = _record(strategy, 0, avg, avg)
        r["spec"]["suite"], r["spec"]["scenario"]["name"], r["spec"]["strategy"]["preset"] = suite, scenario, preset
        return r

    records = [rec("b", "a_scn", "x", 90.0), rec("a", "z_scn", "x", 10.0), rec("a", "a_scn", "y", 50.0),
               rec("a", "a_scn", "x", 50.0, preset=None), rec("a", "a_scn", "w", 60.0)]
    table = leaderboard.build(records)
    assert list(zip(table["suite"], table["scenario"], table["strategy"])) == [
        ("a", "a_scn", "w"), ("a", "a_scn", "x"), ("a", "a_scn", "y"), ("a", "z_scn", "x"), ("b", "a_scn", "x")]
    assert list(table["preset"]) == ["cpu", "default", "cpu", "cpu", "cpu"]


def test_a_lower_is_better_primary_metric_sorts_ascending():
    spec = {"name": "loss", "unit": "", "higher_is_better": False, "primary": True, "columns": {}}
    records = []
    for strategy, value in (("a", 3.0), ("b", 1.0), ("c", 2.0)):
        r = _record(strategy, 0, None, None)
        r["metric_specs"] = [spec]
        r["metrics"].update({"loss_avg_inc": value, "loss_last": value})
        records.append(r)
    table = leaderboard.build(records)
    assert list(table["strategy"]) == ["b", "c", "a"] and table.attrs["primary_columns"][0] == "loss_avg_inc"
    assert "| loss_avg_inc | loss_last | loss_forgetting | loss_bwt |" in leaderboard.to_markdown(table)


def test_labels_name_the_differing_scenario_and_strategy_keys():
    """Records under one label with different identities: the differing keys tag the label, strings unquoted,
    numbers as JSON, an absent key as "–", code fingerprints cut to 7 characters."""
    a, b = _record("ewc", 0, 50.0, 40.0, args={"lam": 1}), _record("ewc", 1, 51.0, 41.0, args={"mode": "online"})
    b["spec"]["scenario"]["args"] = {"n_classes": 4}
    labels = leaderboard.row_labels([a, b])
    assert labels == [("synthetic [n_classes=–]", "ewc [lam=1, mode=–]"),
                      ("synthetic [n_classes=4]", "ewc [lam=–, mode=online]")]
    same = leaderboard.row_labels([_record("ewc", 0, 1, 1, label="e"), _record("ewc", 1, 1, 1, label="e")])
    assert same == [("synthetic", "e"), ("synthetic", "e")]


def test_an_empty_runs_folder_gives_a_header_only_leaderboard(tmp_path):
    (tmp_path / "runs").mkdir()
    table = leaderboard.write(tmp_path)
    assert table.empty and list(table.columns) == ["suite", "scenario", "strategy", "n_seeds"]
    assert (tmp_path / "leaderboard.md").read_text() == f"# Leaderboard: \n\n{HEADER}\n|{'---|' * 14}\n"
    assert pd.read_csv(tmp_path / "leaderboard.csv").columns.tolist() == ["suite", "scenario", "strategy", "n_seeds"]


def test_write_titles_the_markdown_with_the_suites_and_rounds_the_csv(tmp_path):
    records = [_record("naive", 0, 40.123456, 20.0)]
    other = _record("naive", 0, 30.0, 20.0)
    other["spec"]["suite"] = "a"
    table = leaderboard.write(tmp_path, records + [other])
    assert (tmp_path / "leaderboard.md").read_text().splitlines()[0] == "# Leaderboard: a, s"
    assert list(table["suite"]) == ["a", "s"]
    assert "40.1235," in (tmp_path / "leaderboard.csv").read_text()
    assert "leaderboard.md" in {p.name for p in tmp_path.iterdir()}


def test_missing_runs_folder_message_is_exact(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        leaderboard.load_records(tmp_path)
    assert str(info.value) == (f"no run records in {tmp_path / 'runs'}: run a suite first "
                               "(python run_bench.py --suite NAME).")


def test_a_corrupt_record_is_logged_by_path_and_skipped(tmp_path, caplog):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.json").write_text("{cut short")
    good = sealed(_record("naive", 0, 40.0, 20.0))
    (tmp_path / "runs" / "b.json").write_text(json.dumps(good))
    with caplog.at_level("WARNING", logger="clbench.leaderboard"):
        assert leaderboard.load_records(tmp_path) == [good]
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"{tmp_path / 'runs' / 'a.json'}: not a readable JSON file (") and message.endswith(
        "; skipped")


def test_labels_and_overrides_show_values_as_written():
    """Only code fingerprints are cut (to 7 characters); other strings are shown whole; a value that is not JSON
    (a path in an in-memory record) is shown as text."""
    from pathlib import Path

    a = _record("ewc", 0, 50.0, 40.0, args={"mode": "separate_long_name"})
    b = _record("ewc", 1, 51.0, 41.0, args={"mode": "online_long_name"})
    assert [s for _, s in leaderboard.row_labels([a, b])] == ["ewc [mode=separate_long_name]",
                                                             "ewc [mode=online_long_name]"]
    c = _record("naive", 0, 1.0, 1.0, args={"init": Path("ckpt/x.pt")})
    assert leaderboard.build([c])["overrides"][0] == "init=ckpt/x.pt"


def test_machines_of_all_rows_are_listed_once():
    records = [_record("naive", 0, 40.0, 20.0), _record("naive", 1, 50.0, 30.0), _record("ewc", 0, 1.0, 1.0)]
    records[1]["env"]["machine"] = "gpu: b"
    records[2]["env"]["machine"] = "gpu: b"
    md = leaderboard.to_markdown(leaderboard.build(records))
    assert md.splitlines()[-1] == "Machine: cpu: test; gpu: b"


def test_identity_reads_nested_and_unordered_values_and_the_resolved_config():
    """Nested arguments are compared key by key (``model_args.hidden``), dicts inside lists regardless of key order,
    a path like its text; the resolved config (``strategy_config``) decides, so a changed default splits the rows
    even under the same suite args; records without one fall back to preset + args."""
    from pathlib import Path

    a = _record("naive", 0, 1.0, 1.0, args={"model_args": {"hidden": [8]}})
    b = _record("naive", 1, 1.0, 1.0, args={"model_args": {"hidden": [16]}})
    assert [s for _, s in leaderboard.row_labels([a, b])] == ["naive [model_args.hidden=[8]]",
                                                             "naive [model_args.hidden=[16]]"]
    c = _record("naive", 0, 1.0, 1.0, args={"layers": [{"b": 1, "a": 2}], "init": Path("x.pt")})
    d = _record("naive", 1, 1.0, 1.0, args={"layers": [{"a": 2, "b": 1}], "init": "x.pt"})
    assert leaderboard.build([c, d])["n_seeds"].tolist() == [2]
    e, f = _record("naive", 0, 1.0, 1.0), _record("naive", 1, 1.0, 1.0)
    f["strategy_config"] = {"epochs": 3}
    assert sorted(leaderboard.build([e, f])["strategy"]) == ["naive [epochs=2]", "naive [epochs=3]"]
    g, h = _record("naive", 0, 1.0, 1.0, args={"lr": 0.1}), _record("naive", 1, 1.0, 1.0, args={"lr": 0.2})
    del g["strategy_config"], h["strategy_config"]
    assert sorted(leaderboard.build([g, h])["strategy"]) == ["naive [lr=0.1]", "naive [lr=0.2]"]


def test_scenarios_under_one_label_are_split_by_name():
    a, b = _record("naive", 0, 1.0, 1.0), _record("naive", 1, 1.0, 1.0)
    for r, name in ((a, "synthetic"), (b, "split_digits")):
        r["spec"]["scenario"].update(name=name, label="bench")
    assert [s for s, _ in leaderboard.row_labels([a, b])] == ["bench [name=synthetic]", "bench [name=split_digits]"]


def test_records_without_machine_or_code_fingerprint():
    r = _record("naive", 0, 40.0, 20.0)
    del r["env"], r["code_fingerprint"]
    table = leaderboard.build([r])
    assert table["machine"][0] == "" and table["code_fingerprint"][0] == ""
    assert "Machine" not in leaderboard.to_markdown(table)


def test_markdown_decimals_follow_each_columns_unit_and_extra_columns_show_where_present():
    """Percent scores get 2 decimals, a unitless metric's (NDCG) 4, the private/PETL extras (epsilon,
    trainable_pct) 2 with "–" on rows without them; an extra no row has (route_acc) or not in the list is not shown,
    and a non-numeric extra is not a column. Catches a wrong number of decimals and dropped or invented columns."""
    acc = _record("naive", 0, 40.0, 20.0, extra={"epsilon": 3.0, "trainable_pct": 1.5, "other": 2.0, "note": "x"})
    rank = _record("seqrec", 0, None, None)
    rank["spec"]["scenario"]["name"] = "movielens"
    rank["metric_specs"] = [{"name": "ndcg@10", "unit": "", "higher_is_better": True, "primary": True}]
    rank["metrics"].update({"ndcg@10_avg_inc": 0.25, "ndcg@10_last": 0.125, "ndcg@10_forgetting": 0.5,
                            "ndcg@10_bwt": -0.0625})
    table = leaderboard.build([acc, rank])
    assert "note" not in table and "x_note" not in table and table["other"].tolist()[1] == 2.0
    assert table.attrs["units"] == {"avg_inc_acc": "%", "last_acc": "%", "forgetting": "%", "bwt": "%",
                                    "ndcg@10_avg_inc": "", "ndcg@10_last": "", "ndcg@10_forgetting": "",
                                    "ndcg@10_bwt": ""}
    assert leaderboard.to_markdown(table).splitlines()[:4] == [
        "| suite | scenario | strategy | preset | overrides | seeds | avg_inc_acc | last_acc | forgetting | bwt | "
        "ndcg@10_avg_inc | ndcg@10_last | ndcg@10_forgetting | ndcg@10_bwt | epsilon | trainable_pct | params_M | "
        "params_added_M | train_s | peak_mem_MB |",
        "|" + "---|" * 20,
        "| s | movielens | seqrec | cpu | – | 1 | – | – | – | – | 0.2500 (n=1) | 0.1250 (n=1) | 0.5000 (n=1) "
        "| -0.0625 (n=1) "
        "| – | – | 1.000 | 0.500 | 2.0 | 3.0 |",
        "| s | synthetic | naive | cpu | – | 1 | 40.00 (n=1) | 20.00 (n=1) | 10.00 (n=1) | -5.00 (n=1) | – | – | – | – "
        "| 3.00 (n=1) | 1.50 (n=1) | 1.000 | 0.500 | 2.0 | 3.0 |"]


def test_columns_in_order_and_a_fresh_index():
    """The CSV's columns, in order: labels, seed counts, preset and overrides, each score with its std, costs
    without std, numeric extras with std, machine, code, primary metric; rows re-sorted get a fresh 0..n-1 index
    (no stray "index" column). Catches a renamed, lost or extra column."""
    records = [_record("naive", 0, 40.0, 20.0, extra={"epsilon": 1.0}), _record("replay", 0, 70.0, 60.0)]
    table = leaderboard.build(records)
    assert list(table["strategy"]) == ["replay", "naive"] and list(table.index) == [0, 1]
    assert list(table.columns) == [
        "suite", "scenario", "strategy", "n_seeds", "n_failed", "preset", "overrides",
        "avg_inc_acc", "avg_inc_acc_std", "last_acc", "last_acc_std", "forgetting", "forgetting_std", "bwt", "bwt_std",
        "params_M", "params_added_M", "trainable_params_M", "train_s", "eval_s", "peak_mem_MB", "epsilon",
        "epsilon_std", "machine", "code_fingerprint", "flags", "primary_metric"]


def test_callbacks_and_a_missing_code_fingerprint_are_part_of_the_identity():
    """Strategy entry keys beyond name/label/preset/args (here ``callbacks``) split rows when they differ and are
    shown as JSON; an empty one is the same as none; a record without a code fingerprint is ``code=unknown`` beside
    one with it. Catches callbacks left out of the identity and an unlabelled code split."""
    a, b = _record("naive", 0, 1.0, 1.0), _record("naive", 1, 1.0, 1.0)
    a["spec"]["strategy"]["callbacks"] = [{"name": "dp", "args": {"epsilon": 1}}]
    b["spec"]["strategy"]["callbacks"] = [{"name": "dp", "args": {"epsilon": 8}}]
    assert [s for _, s in leaderboard.row_labels([a, b])] == [
        'naive [callbacks=[{"args": {"epsilon": 1}, "name": "dp"}]]',
        'naive [callbacks=[{"args": {"epsilon": 8}, "name": "dp"}]]']
    c, d = _record("naive", 0, 1.0, 1.0), _record("naive", 1, 1.0, 1.0)
    c["spec"]["strategy"]["callbacks"] = []
    assert leaderboard.row_labels([c, d]) == [("synthetic", "naive")] * 2
    del c["code_fingerprint"]
    assert [s for _, s in leaderboard.row_labels([c, d])] == ["naive [code=unknown]", "naive [code=ccccccc]"]


def test_identity_keys_that_do_not_split_rows_and_those_that_do():
    """An explicit label equal to the name is the same row as no label; the preset does not split rows whose
    resolved configs are equal, but does when records lack a resolved config; two strategies under one label are
    split by name; a row of several presets or overrides lists each once. Catches the label or preset wrongly made
    part of the identity, and a lost name or preset."""
    a, b = _record("naive", 0, 1.0, 1.0, label="naive"), _record("naive", 1, 1.0, 1.0)
    assert leaderboard.row_labels([a, b]) == [("synthetic", "naive")] * 2
    b["spec"]["strategy"]["preset"] = "full"
    b["spec"]["strategy"]["args"] = {"epochs": 2}                   # the resolved config already says so
    assert leaderboard.row_labels([a, b]) == [("synthetic", "naive")] * 2
    row = leaderboard.build([a, b]).iloc[0]
    assert row["preset"] == "cpu,full" and row["overrides"] == "epochs=2 | –" and row["n_seeds"] == 2
    b["spec"]["strategy"]["args"] = {}
    del a["strategy_config"], b["strategy_config"]
    assert [s for _, s in leaderboard.row_labels([a, b])] == ["naive [preset=cpu]", "naive [preset=full]"]
    c, d = _record("ewc", 0, 1.0, 1.0, label="reg"), _record("lwf", 1, 1.0, 1.0, label="reg")
    assert [s for _, s in leaderboard.row_labels([c, d])] == ["reg [name=ewc]", "reg [name=lwf]"]


def test_a_failed_record_without_metrics_and_a_score_that_is_not_a_number_count_as_missing():
    """A failed in-memory record without a ``metrics`` key is counted in ``n_failed`` (catches a crash reading its
    metrics); a score that is not a number ("n/a") is left out of that column's mean like a missing one instead of
    failing the table (catches the numeric conversion made strict). By hand: avg_inc_acc of {40} is 40 with no std;
    last_acc of {30, 20} is 25 with sample std sqrt(50) = 7.0710678."""
    failed = _record("naive", 0, 0, 0, status="failed")
    del failed["metrics"]
    row = leaderboard.build([failed, _record("naive", 1, "n/a", 30.0), _record("naive", 2, 40.0, 20.0)]).iloc[0]
    assert row["n_seeds"] == 2 and row["n_failed"] == 1
    assert row["avg_inc_acc"] == pytest.approx(40.0) and math.isnan(row["avg_inc_acc_std"])
    assert row["last_acc"] == pytest.approx(25.0) and row["last_acc_std"] == pytest.approx(7.0710678)


def test_fingerprints_alike_in_their_first_7_characters_share_a_row_that_lists_each():
    """Labels cut code fingerprints to 7 characters, so two fingerprints alike that far share the label and the
    row; its ``code_fingerprint`` lists both, sorted and "; "-separated, so the merge shows (catches a changed
    separator)."""
    a = _record("naive", 0, 40.0, 20.0, code="abcdefg" + "2" * 9)
    b = _record("naive", 1, 50.0, 30.0, code="abcdefg" + "1" * 9)
    table = leaderboard.build([a, b])
    assert list(table["strategy"]) == ["naive [code=abcdefg]"] and table["n_seeds"][0] == 2
    assert table["code_fingerprint"][0] == "abcdefg111111111; abcdefg222222222"


def test_an_infinite_mean_is_written_as_inf_in_the_csv(tmp_path):
    """A run trained without noise spends epsilon = inf; the CSV holds it as ``inf``, the spelling pandas reads back
    as a float (catches the float format's case changed: ``%.4F`` writes ``INF``)."""
    import csv

    leaderboard.write(tmp_path, [_record("naive", 0, 40.0, 20.0, extra={"epsilon": math.inf})])
    with open(tmp_path / "leaderboard.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["epsilon"] == "inf" and row["avg_inc_acc"] == "40.0000"
    assert math.isinf(pd.read_csv(tmp_path / "leaderboard.csv")["epsilon"][0])


def test_rows_without_an_avg_inc_or_last_value_sort_after_those_with_one():
    """Only the primary ``avg_inc``, else its ``last``, ranks a row: a row with neither (its forgetting of 10
    recorded all the same) and a row whose only seed failed both sort after the rows with a value, by label, though
    given first (catches the rank reading a third column, and rows without a value left where they came)."""
    records = [_record("a_none", 0, None, None), _record("b_failed", 0, 0, 0, status="failed"),
               _record("c_low", 0, 5.0, 5.0), _record("d_high", 0, 50.0, 50.0)]
    assert list(leaderboard.build(records)["strategy"]) == ["d_high", "c_low", "a_none", "b_failed"]


def test_checkpoint_contents_and_amp_split_rows_and_label_them():
    """The identity holds the content hash of every checkpoint read (same path, other weights: another experiment)
    and bf16 autocast when on; both tag the labels of records under one label, an absent key as "–". Catches
    either left out of the identity, stored under another key or with another value."""
    a, b = _record("naive", 0, 1.0, 1.0), _record("naive", 1, 1.0, 1.0)
    a["checkpoints"], b["checkpoints"] = {"init": "aaaa"}, {"init": "bbbb"}
    assert [s for _, s in leaderboard.row_labels([a, b])] == ["naive [checkpoints.init=aaaa]",
                                                             "naive [checkpoints.init=bbbb]"]
    c, d = _record("naive", 0, 1.0, 1.0), _record("naive", 1, 1.0, 1.0)
    c["spec"]["amp"], d["spec"]["amp"] = True, False
    assert [s for _, s in leaderboard.row_labels([c, d])] == ["naive [amp=true]", "naive [amp=–]"]
    c["spec"]["amp"], d["checkpoints"] = False, {}
    assert leaderboard.row_labels([c, d]) == [("synthetic", "naive")] * 2


def _adequacy(train_acc, k=2):
    return [{"experience": 0, "train_acc": 0.9, "k": k, "epochs": 5, "loss_drop": 0.0},
            {"experience": 1, "train_acc": train_acc, "k": k, "epochs": 5, "loss_drop": 0.01}]


def test_adequacy_flags_become_a_column_and_a_markdown_column_with_its_legend():
    """A row with a flagged seed (step 1's training accuracy 0.1 < 1.5/k for k = 2) gets its flag text; a row
    without gets ""; the markdown then shows a ``flags`` column between the scores and the costs, each row's flag
    in it (escaped like any cell), and the flags legend after the scores legend. Catches the flags not computed,
    their column or legend lost or renamed."""
    bad = [_record("naive", s, 40.0, 20.0) for s in (0, 1)]
    bad[0]["adequacy"], bad[1]["adequacy"] = _adequacy(0.1), _adequacy(0.9)
    good = _record("replay", 0, 70.0, 60.0)
    good["adequacy"] = _adequacy(0.9)
    table = leaderboard.build(bad + [good])
    assert list(table["flags"]) == ["", "not learned (1/2 seeds; step 2; train)"]
    md = leaderboard.to_markdown(table).splitlines()
    assert md[0] == HEADER.replace("| bwt |", "| bwt | flags |")
    assert md[2].endswith("| -5.00 (n=1) |  | 1.000 | 0.500 | 2.0 | 3.0 |")
    assert md[3].endswith("| -5.00 ± 0.00 | not learned (1/2 seeds; step 2; train) | 1.000 | 0.500 | 2.0 | 3.0 |")
    assert md[4:] == ["", leaderboard.LEGEND, "", adequacy.FLAGS_LEGEND, "", "Machine: cpu: test"]


def test_flagged_reads_only_non_empty_flag_cells():
    """A table read back from a CSV has NaN for a row without flags, and older tables no ``flags`` column: neither
    counts as flagged; any non-empty text does, one character included."""
    assert not leaderboard.flagged(pd.DataFrame({"flags": [math.nan, ""]}))
    assert not leaderboard.flagged(pd.DataFrame({"strategy": ["x"]}))
    assert leaderboard.flagged(pd.DataFrame({"flags": [math.nan, "x"]}))


def test_flags_of_records_without_adequacy_read_the_committed_training_log(tmp_path):
    """A record written before ``adequacy`` existed is flagged from its training log under the results folder
    (``<root>/artifacts/<run_id>/training_log.jsonl``): epoch losses 1.0, 0.8, 0.6, 0.4, 0.2 still drop by
    (0.4 - 0.2) / 1.0 = 0.2 >= 0.05 in the last fifth: not converged, source "log". ``write`` passes its folder,
    ``build`` its ``root``; without a root nothing is read. Catches the folder not passed on."""
    record = _record("naive", 0, 40.0, 20.0)
    log = tmp_path / "artifacts" / record["run_id"] / "training_log.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps({"member": "", "experience": 0, "epoch": e, "step": e, "loss": loss}) + "\n"
                           for e, loss in enumerate([1.0, 0.8, 0.6, 0.4, 0.2])))
    expected = "not converged (1/1 seeds; step 1; log)"
    assert leaderboard.build([record], tmp_path)["flags"][0] == expected
    assert leaderboard.build([record])["flags"][0] == ""
    assert leaderboard.write(tmp_path, [record])["flags"][0] == expected
    assert f"| {expected} |" in (tmp_path / "leaderboard.md").read_text()


def test_markdown_cells_copy_labels_literally():
    """A label that would end the table, link, inject HTML or break the line is escaped in leaderboard.md (each
    character that means something in markdown gets a backslash; line breaks become spaces); names and overrides
    made of ``_ . + - = [ ]`` are left as they are."""
    records = [_record("naive", 0, 40.0, 20.0, label="x|<img src=y onerror=z>[a](javascript:b)\n*c* `d` ~e~ &f \\")]
    md = leaderboard.to_markdown(leaderboard.build(records)).splitlines()
    assert md[2].startswith("| s | synthetic | x\\|\\<img src=y onerror=z\\>[a]\\(javascript:b) \\*c\\* \\`d\\` "
                            "\\~e\\~ \\&f \\\\ | cpu | – | 1 |")
    assert leaderboard.markdown_text("split_digits [mem_size=20, hidden=[8]] 1.0e-3+x") == (
        "split_digits [mem_size=20, hidden=[8]] 1.0e-3+x")


# ------------------------------------------------------------------------------------------------------- mixing
def test_leaderboard_never_averages_records_of_different_configurations(tiny_suite, tmp_path):
    """The issue's example: mem_size 100 (seed 0) and mem_size 20 (seed 1) written into one --out (the issue's 200
    is more than the tiny stream's 120 samples: refused at load)."""
    out = tmp_path / "out"
    for mem_size, seed in ((100, 0), (20, 1)):
        suite = tiny_suite([{"name": "replay", "preset": "cpu", "args": {"epochs": 1, "mem_size": mem_size}}],
                           seeds=(seed,))
        assert run_suite(suite, out) == 0
    table = pd.read_csv(out / "leaderboard.csv")
    assert set(table["strategy"]) == {"replay [mem_size=20]", "replay [mem_size=100]"}
    assert (table["n_seeds"] == 1).all()


# 60 examples per test; `make mutation` runs each mutant's tests with fewer (tests/mutation_report.py)
PROFILE = settings(max_examples=int(os.environ.get("CLBENCH_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
                   derandomize=True)


# ---------------------------------------------------------------------------------------------------- leaderboard
SCORES = ("avg_inc_acc", "last_acc", "forgetting", "bwt")


COSTS = ("params_M", "params_added_M", "trainable_params_M", "train_s", "eval_s", "peak_mem_MB")


def _drawn_record(strategy: str, mem: int, seed: int, values: dict, status: str = "finished") -> dict:
    return {"run_id": f"syn__{strategy}__s{seed}", "seed": seed, "status": status, "code_fingerprint": "f" * 16,
            "spec": {"suite": "p", "scenario": {"name": "synthetic", "label": "", "args": {}},
                     "strategy": {"name": strategy, "label": "", "preset": "cpu", "args": {"mem_size": mem}}},
            "strategy_config": {"mem_size": mem}, "env": {"machine": "m"},
            "metrics": values if status == "finished" else {}}


@st.composite
def run_sets(draw):
    """Records of 1-4 configurations (strategy x mem_size), 1-4 seeds each, some failed, in random order."""
    configs = draw(st.lists(st.tuples(st.sampled_from(["naive", "replay", "ewc"]), st.sampled_from([10, 20])),
                            min_size=1, max_size=4, unique=True))
    value = st.floats(0, 100, allow_nan=False)
    records = []
    for strategy, mem in configs:
        for seed in range(draw(st.integers(1, 4))):
            status = draw(st.sampled_from(["finished", "finished", "failed"]))
            values = {m: draw(value) for m in (*SCORES, *COSTS)}
            records.append(_drawn_record(strategy, mem, seed, values, status))
    return draw(st.permutations(records))


@PROFILE
@given(run_sets())
def test_leaderboard_mean_and_std_are_numpys_over_the_finished_seeds_one_row_per_configuration(records):
    """One row per distinct configuration (strategy, resolved config); its mean is numpy's mean and its ``_std``
    numpy's sample std (ddof=1) over the finished records of that configuration (NaN for 0 or 1 of them); n_seeds
    and n_failed count them; costs have means and no std."""
    table = leaderboard.build(records)
    configs = {(r["spec"]["strategy"]["name"], r["strategy_config"]["mem_size"]) for r in records}
    assert len(table) == len(configs)
    multi = {name for name in {c[0] for c in configs} if sum(c[0] == name for c in configs) > 1}
    for (name, mem) in configs:
        label = f"{name} [mem_size={mem}]" if name in multi else name
        row = table[table["strategy"] == label]
        assert len(row) == 1, label
        row = row.iloc[0]
        mine = [r for r in records if (r["spec"]["strategy"]["name"], r["strategy_config"]["mem_size"]) == (name, mem)]
        ok = [r for r in mine if r["status"] == "finished"]
        assert row["n_seeds"] == len(ok) and row["n_failed"] == len(mine) - len(ok)
        for m in (*SCORES, *COSTS):
            values = np.array([r["metrics"][m] for r in ok])
            expected = values.mean() if len(values) else np.nan
            assert row[m] == pytest.approx(expected, rel=1e-12, abs=1e-12, nan_ok=True), m
            if m in SCORES:
                std = values.std(ddof=1) if len(values) > 1 else np.nan
                assert row[f"{m}_std"] == pytest.approx(std, rel=1e-9, abs=1e-9, nan_ok=True), m
            else:
                assert f"{m}_std" not in table.columns


@PROFILE
@given(run_sets(), st.randoms(use_true_random=False))
def test_leaderboard_is_sorted_best_first_and_independent_of_record_order(records, rnd):
    """Rows are sorted by avg_inc_acc, best first (rows without one last), ties by label; shuffling the records
    gives the same table."""
    table = leaderboard.build(records)
    keys = [(np.inf if pd.isna(a) else -a, s) for a, s in zip(table["avg_inc_acc"], table["strategy"])]
    assert keys == sorted(keys)
    shuffled = list(records)
    rnd.shuffle(shuffled)
    pd.testing.assert_frame_equal(leaderboard.build(shuffled), table)
