"""run_bench.py end to end on a tiny suite: run, resume, leaderboard, list, and error exits."""

import json

import pandas as pd

from clbench.cli import main


def test_run_resume_and_rebuild_leaderboard(tiny_suite, tmp_path, capsys):
    suite = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}},
                        {"name": "replay", "preset": "cpu", "args": {"epochs": 1, "mem_size": 30}}], seeds=(0, 1))
    out = tmp_path / "out"
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    records = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert records == ["synthetic__naive__s0.json", "synthetic__naive__s1.json",
                       "synthetic__replay__s0.json", "synthetic__replay__s1.json"]
    table = pd.read_csv(out / "leaderboard.csv")
    assert set(table["strategy"]) == {"naive", "replay"} and (table["n_seeds"] == 2).all()
    assert (out / "plots" / "synthetic__accuracy.png").exists()

    stamp = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table"]) == 0   # resume: no rerun
    assert stamp == {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}

    (out / "leaderboard.csv").unlink()
    assert main(["leaderboard", "--out", str(out)]) == 0
    assert (out / "leaderboard.csv").exists()
    assert json.loads((out / "runs" / records[0]).read_text())["status"] == "finished"


def test_list_prints_registries(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for name in ("split_digits", "naive", "der_dark", "quick", "resnet32"):
        assert name in text


def test_unknown_strategy_exits_2_with_suggestion(tiny_suite, tmp_path, capsys):
    suite = tiny_suite([{"name": "replya"}])
    assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "Did you mean 'replay'" in capsys.readouterr().err


def test_unknown_override_exits_2(capsys):
    assert main(["--suite", "quick", "--strategy", "nave", "--quiet"]) == 2
    assert "has no strategy 'nave'. Did you mean 'naive'" in capsys.readouterr().err
