"""report.md from records only: the per-scenario summary (best per metric, gap to the joint upper bound, forgetting
ranking) checked against numbers computed by hand, the plots it links exist, failed runs and provenance are listed;
``run_bench.py report`` and the end of a suite run write it."""

from __future__ import annotations

import re

import tests._fakes  # noqa: F401  (registers test_increasing_logits)
from clbench import suite_report
from clbench.cli import main
from clbench.metrics import ACCURACY

ENV = {"machine": "cpu: 2 cores (test)", "device": "cpu", "python": "3.11.7", "git_commit": "abcdef1234567890",
       "packages": {"torch": "2.14.1"}}


def _record(strategy: str, seed: int, avg: float | None, last: float, forgetting: float | None,
            status: str = "finished", reason: str | None = None) -> dict:
    offline = avg is None
    R = [[last / 100] * 2] if offline else [[0.9, 0.0], [0.5, 0.9]]
    return {"run_id": f"sc__{strategy}__s{seed}", "status": status, "seed": seed, "reason": reason,
            "spec": {"suite": "s", "scenario": {"name": "sc", "args": {}},
                     "strategy": {"name": strategy, "preset": "cpu", "args": {}}},
            "strategy_config": {"preset": "cpu"}, "code_fingerprint": "f" * 16, "env": ENV,
            "metric_specs": [ACCURACY.to_dict()], "accuracy_matrix": R, "matrices": {"accuracy": R},
            "test_sizes": [10, 10], "params_per_step": [{"total": 10, "trainable": 10}] * len(R),
            "started": f"2026-01-0{seed + 1}T00:00:00+00:00", "finished": f"2026-01-0{seed + 1}T00:01:00+00:00",
            "metrics": {} if status == "failed" else
            {"avg_inc_acc": avg, "last_acc": last, "forgetting": forgetting,
             "bwt": None if forgetting is None else -forgetting, "train_s": 30.0, "params_M": 1e-5}}


RECORDS = [_record("a", 0, 80.0, 60.0, 30.0), _record("a", 1, 84.0, 64.0, 34.0),       # a: 82 / 62 / 32
           _record("b", 0, 70.0, 66.0, 10.0), _record("b", 1, 72.0, 68.0, 14.0),       # b: 71 / 67 / 12
           _record("joint", 0, None, 90.0, None), _record("joint", 1, None, 92.0, None),  # joint last 91
           _record("c", 0, None, 0.0, None, status="failed", reason="NonFiniteLossError: loss is nan")]


def test_summary_numbers_plots_failures_and_provenance(tmp_path):
    path = suite_report.write(tmp_path, RECORDS)
    text = path.read_text()
    assert "7 run records" in text and "(6 finished, 1 failed)" in text
    assert "3.0 min of training in total" in text                                  # 6 finished x 30 s
    assert "- best `avg_inc_acc` (highest): `a` with 82.00 ± 2.83" in text
    assert "- best `last_acc` (highest): `joint` with 91.00 ± 1.41" in text
    assert "- best `forgetting` (lowest): `b` with 12.00 ± 2.83" in text
    assert "- best `bwt` (highest): `b` with -12.00 ± 2.83" in text
    assert "- joint upper bound: `joint`, `last_acc` 91.00 ± 1.41" in text
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| \d+ \| `(\w+)` .*$", text, re.M)}
    assert set(rows) == {"a", "b"}                                                 # continual rows only
    assert rows["a"] == "| 1 | `a` | 2 | 82.00 ± 2.83 | 62.00 ± 2.83 | 29.00 | 32.00 ± 2.83 | 2 |"
    assert rows["b"] == "| 2 | `b` | 2 | 71.00 ± 1.41 | 67.00 ± 1.41 | 24.00 | 12.00 ± 2.83 | 1 |"
    images = re.findall(r"\]\((plots/[^)]+\.png)\)", text)
    assert "plots/sc__accuracy.png" in images and "plots/sc__a__accuracy__matrix.png" in images
    assert all((tmp_path / image).is_file() for image in images)
    assert "- `sc__c__s0`: NonFiniteLossError: loss is nan" in text
    assert "cpu: 2 cores (test)" in text and "abcdef1234" in text and "torch 2.14.1" in text
    assert "| s | sc | a | cpu |" in text                                           # the leaderboard


def test_without_an_offline_run_there_is_no_gap(tmp_path):
    text = suite_report.write(tmp_path, RECORDS[:4]).read_text()
    assert "no offline (joint) row in this suite: no upper bound" in text
    assert "| 1 | `a` | 2 | 82.00 ± 2.83 | 62.00 ± 2.83 | 32.00 ± 2.83 | 2 |" in text and "gap to joint" not in text


def test_a_single_experience_has_no_forgetting_columns(tmp_path):
    text = suite_report.write(tmp_path, [_record("a", 0, 50.0, 50.0, None), _record("b", 0, 40.0, 40.0, None)]
                              ).read_text()
    assert "| 1 | `a` | 1 | 50.00 ± – | 50.00 ± – |" in text and "forgetting rank" not in text
    assert "Forgetting is undefined here (a single experience)." in text


def test_run_and_report_commands_write_report_md(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table", "--device", "cpu"]) == 0
    assert "`test_increasing_logits`" in (out / "report.md").read_text()
    (out / "report.md").unlink()
    assert main(["report", "--out", str(out)]) == 0
    assert (out / "report.md").exists() and f"report: {out / 'report.md'}" in capsys.readouterr().err
    assert main(["report", "--out", str(tmp_path / "nothing")]) == 2
    assert "no run records in" in capsys.readouterr().err
