"""report.md from records only: the per-scenario summary (best per metric, gap to the joint upper bound, forgetting
ranking) checked line by line against numbers computed by hand, the plots it links, failed runs and provenance;
``run_bench.py report`` and the end of a suite run write it.

``render`` is checked on made-up plot paths (nothing is drawn); ``write`` draws the plots of one small record."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

import tests._fakes  # noqa: F401  (registers test_increasing_logits)
from clbench import leaderboard, suite_report
from clbench.cli import main
from clbench.metrics import ACCURACY
from tests._records import sealed

ENV = {"machine": "cpu: 2 cores (test)", "device": "cpu", "python": "3.11.7", "git_commit": "abcdef1234567890",
       "packages": {"torch": "2.14.1"}, "cpu_model": "Test CPU", "cpu_capability": "AVX2"}
LOSS = {"name": "loss", "unit": "", "higher_is_better": False, "primary": True, "columns": {}}
OUT = Path("/r/out")                       # render only reads the records and the plot paths: no folder needed


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


def _loss_record(strategy: str, avg: float | None, last: float | None, forgetting: float | None,
                 bwt: float | None, label: str = "", status: str = "finished") -> dict:
    """A record of scenario ``z`` whose primary metric is a loss (lower is better, no unit), seed 0."""
    return {"run_id": f"z__{strategy}__s0", "status": status, "seed": 0, "reason": None,
            "spec": {"suite": "s", "scenario": {"name": "z", "args": {}},
                     "strategy": {"name": strategy, "label": label, "preset": "cpu", "args": {}}},
            "strategy_config": {"preset": "cpu"}, "code_fingerprint": "e" * 16,
            "env": {"machine": "gpu: 1x test", "device": "cuda", "python": "3.12.1", "git_commit": None,
                    "packages": {"torch": "2.14.1", "numpy": "2.1.0", "opacus": None}},
            "metric_specs": [LOSS], "matrices": {"loss": [[1.0]]}, "test_sizes": [10],
            "started": "2026-01-05T00:00:00+00:00", "finished": None,
            "metrics": {} if status == "failed" else
            {"loss_avg_inc": avg, "loss_last": last, "loss_forgetting": forgetting, "loss_bwt": bwt,
             "train_s": 60.0}}


RECORDS = [_record("a", 0, 80.0, 60.0, 30.0), _record("a", 1, 84.0, 64.0, 34.0),       # a: 82 / 62 / 32
           _record("b", 0, 70.0, 66.0, 10.0), _record("b", 1, 72.0, 68.0, 14.0),       # b: 71 / 67 / 12
           _record("joint", 0, None, 90.0, None), _record("joint", 1, None, 92.0, None),  # joint last 91
           _record("c", 0, None, 0.0, None, status="failed", reason="NonFiniteLossError: loss is nan")]
# z: loss, lower is better; "v" (labelled "p|q") and "u" tie on avg_inc 2.0; "oracle" is the offline row
LOSS_RECORDS = [_loss_record("u", 2.0, 3.0, 0.5, 0.4), _loss_record("v", 2.0, 2.5, 1.0, -1.0, label="p|q"),
                _loss_record("oracle", None, 1.5, None, None),
                _loss_record("w", None, None, None, None, status="failed")]
LOSS_RECORDS[0]["code_fingerprint"] = None
del LOSS_RECORDS[2]["env"]
PLOTS = [OUT / "plots" / name for name in (                 # unsorted; one file of a scenario without rows
    "z__u__loss__matrix.png", "sc__params.png", "sc__b__accuracy__matrix.png", "other__accuracy.png",
    "sc__accuracy.png", "z__loss.png", "sc__joint__accuracy__matrix.png", "sc__a__accuracy__matrix.png",
    "z__p_q__loss__matrix.png")]


def test_report_md_line_by_line():
    """The whole report of two scenarios: counts, time span and training minutes; per scenario the best row per
    summary (ties listed; a loss's best avg_inc, last and bwt are the lowest, its forgetting too, as for accuracy:
    forgetting is the amount lost for every metric), the joint upper bound, the ranking table ("|" escaped, gap
    signed so that positive is worse than joint, forgetting rank 1 = least forgetting; a percentage with 2 decimals, a
    unitless metric such as the loss with 4, as in the leaderboard); the plots sorted per scenario
    (curves inline, matrices and params as links); the leaderboard as is; failed runs; provenance deduplicated and
    sorted, with "unknown" for what a record lacks. Catches any dropped line, wrong word, number, sign or order."""
    records = RECORDS + LOSS_RECORDS
    text = suite_report.render(records, PLOTS, OUT)
    board = leaderboard.to_markdown(leaderboard.build(records)).rstrip()
    assert text == "\n".join([
        "# Report: s", "",
        "Built from the 11 run records in `/r/out/runs/` only (9 finished, 2 failed): 2 scenario(s), 8 strategy "
        "row(s), seeds 0, 1. Runs from 2026-01-01T00:00:00+00:00 to 2026-01-05T00:00:00+00:00; 6.0 min of training "
        "in total.", "",
        "## Summary per scenario", "",
        "### sc", "",
        "Primary metric: `accuracy` (%); 2 continual strategies, 1 offline (joint) row(s).", "",
        "- best `avg_inc_acc` (highest): `a` with 82.00 ± 2.83",
        "- best `last_acc` (highest): `joint` with 91.00 ± 1.41",
        "- best `forgetting` (lowest): `b` with 12.00 ± 2.83",
        "- best `bwt` (highest): `b` with -12.00 ± 2.83",
        "- joint upper bound: `joint`, `last_acc` 91.00 ± 1.41", "",
        "| rank | strategy | seeds | avg_inc_acc | last_acc | gap to joint (last_acc) | forgetting | forgetting rank |",
        "|---|---|---|---|---|---|---|---|",
        "| 1 | `a` | 2 | 82.00 ± 2.83 | 62.00 ± 2.83 | 29.00 | 32.00 ± 2.83 | 2 |",
        "| 2 | `b` | 2 | 71.00 ± 1.41 | 67.00 ± 1.41 | 24.00 | 12.00 ± 2.83 | 1 |", "",
        "Gap to joint: `last_acc` of `joint` minus the strategy's (positive: below the upper bound). Forgetting rank 1 "
        "= least forgetting.", "",
        "### z", "",
        "Primary metric: `loss`; 2 continual strategies, 1 offline (joint) row(s).", "",
        "- best `loss_avg_inc` (lowest): `p|q`, `u` with 2.0000 (n=1)",
        "- best `loss_last` (lowest): `oracle` with 1.5000 (n=1)",
        "- best `loss_forgetting` (lowest): `u` with 0.5000 (n=1)",
        "- best `loss_bwt` (lowest): `p|q` with -1.0000 (n=1)",
        "- joint upper bound: `oracle`, `loss_last` 1.5000 (n=1)", "",
        "| rank | strategy | seeds | loss_avg_inc | loss_last | gap to joint (loss_last) | loss_forgetting | "
        "forgetting rank |",
        "|---|---|---|---|---|---|---|---|",
        "| 1 | `p\\|q` | 1 | 2.0000 (n=1) | 2.5000 (n=1) | 1.0000 | 1.0000 (n=1) | 2 |",
        "| 2 | `u` | 1 | 2.0000 (n=1) | 3.0000 (n=1) | 1.5000 | 0.5000 (n=1) | 1 |", "",
        "Gap to joint: `loss_last` of `oracle` minus the strategy's (positive: below the upper bound). Forgetting rank "
        "1 = least forgetting.", "",
        "## Plots", "",
        "### sc", "",
        "![sc__accuracy](plots/sc__accuracy.png)", "",
        "Score matrices R[i, j] (mean over seeds): [a · accuracy](plots/sc__a__accuracy__matrix.png), "
        "[b · accuracy](plots/sc__b__accuracy__matrix.png), [joint · accuracy](plots/sc__joint__accuracy__matrix.png)",
        "",
        "Parameters per step: [plot](plots/sc__params.png)", "",
        "### z", "",
        "![z__loss](plots/z__loss.png)", "",
        "Score matrices R[i, j] (mean over seeds): [p_q · loss](plots/z__p_q__loss__matrix.png), "
        "[u · loss](plots/z__u__loss__matrix.png)", "",
        "",
        "## Leaderboard", "", board, "",
        "## Failed runs", "",
        "- `sc__c__s0`: NonFiniteLossError: loss is nan",
        "- `z__w__s0`: no reason recorded", "",
        "## Machine and code", "",
        "- machine: cpu: 2 cores (test); gpu: 1x test; unknown",
        "- CPU: Test CPU (torch CPU kernels: AVX2); not recorded",
        "- device: cpu, cuda, unknown; python 3.11.7, 3.12.1, ?",
        "- packages: numpy 2.1.0, torch 2.14.1",
        "- git commit(s) of the runs: abcdef1234, unknown",
        "- code fingerprints (3): eeeeeeeeeeeeeeee, ffffffffffffffff, unknown (per row in leaderboard.csv)", ""])


def test_without_an_offline_run_there_is_no_gap():
    """No offline row: the section says there is no upper bound, the table has no gap column and the notes no gap
    sentence; catches a gap computed against a missing joint."""
    text = suite_report.render(RECORDS[:4], [], OUT)
    section = text[text.index("### sc"):text.index("## Plots")]
    assert section.splitlines() == [
        "### sc", "",
        "Primary metric: `accuracy` (%); 2 continual strategies, 0 offline (joint) row(s).", "",
        "- best `avg_inc_acc` (highest): `a` with 82.00 ± 2.83",
        "- best `last_acc` (highest): `b` with 67.00 ± 1.41",
        "- best `forgetting` (lowest): `b` with 12.00 ± 2.83",
        "- best `bwt` (highest): `b` with -12.00 ± 2.83",
        "- no offline (joint) row in this suite: no upper bound to compare with", "",
        "| rank | strategy | seeds | avg_inc_acc | last_acc | forgetting | forgetting rank |",
        "|---|---|---|---|---|---|---|",
        "| 1 | `a` | 2 | 82.00 ± 2.83 | 62.00 ± 2.83 | 32.00 ± 2.83 | 2 |",
        "| 2 | `b` | 2 | 71.00 ± 1.41 | 67.00 ± 1.41 | 12.00 ± 2.83 | 1 |", "",
        "Forgetting rank 1 = least forgetting.", ""]


def test_a_single_experience_has_no_forgetting_columns():
    """Forgetting and bwt undefined (one experience): no best line for them, no forgetting columns, the note says
    why; a strategy tied on rank keeps its leaderboard order. Catches a best line or rank shown for undefined
    values."""
    records = [_record("a", 0, 50.0, 50.0, None), _record("b", 0, 40.0, 40.0, None)]
    text = suite_report.render(records, [], OUT)
    section = text[text.index("### sc"):text.index("## Plots")]
    assert section.splitlines() == [
        "### sc", "",
        "Primary metric: `accuracy` (%); 2 continual strategies, 0 offline (joint) row(s).", "",
        "- best `avg_inc_acc` (highest): `a` with 50.00 (n=1)",
        "- best `last_acc` (highest): `a` with 50.00 (n=1)",
        "- no offline (joint) row in this suite: no upper bound to compare with", "",
        "| rank | strategy | seeds | avg_inc_acc | last_acc |",
        "|---|---|---|---|---|",
        "| 1 | `a` | 1 | 50.00 (n=1) | 50.00 (n=1) |",
        "| 2 | `b` | 1 | 40.00 (n=1) | 40.00 (n=1) |", "",
        "Forgetting is undefined here (a single experience).", ""]


def test_a_scenario_of_offline_runs_only_has_no_table():
    """Only a joint run: its last is the best and the upper bound, and no ranking table follows; catches a table of
    zero rows or a missing best line."""
    text = suite_report.render(RECORDS[4:5], [], OUT)
    section = text[text.index("### sc"):text.index("## Plots")]
    assert section.splitlines() == [
        "### sc", "",
        "Primary metric: `accuracy` (%); 0 continual strategies, 1 offline (joint) row(s).", "",
        "- best `last_acc` (highest): `joint` with 90.00 (n=1)",
        "- joint upper bound: `joint`, `last_acc` 90.00 (n=1)", ""]


def test_a_forgetting_undefined_for_one_strategy_is_a_dash_and_ranks_are_shared_on_ties():
    """A strategy without forgetting shows "–" in both forgetting cells; equal forgetting shares the lowest rank
    (1, 1, not 1, 2); a continual row without last shows "–" as its gap. Catches NaN ranked or printed as a number
    and ranks by order instead of value."""
    records = [_record("a", 0, 80.0, 60.0, 10.0), _record("b", 0, 70.0, 66.0, 10.0),
               _record("c", 0, 60.0, 50.0, None), _record("joint", 0, None, 90.0, None)]
    records[2]["metrics"]["last_acc"] = None
    lines = suite_report.render(records, [], OUT).splitlines()
    assert [line for line in lines if line.startswith("| ") and line[2].isdigit()] == [
        "| 1 | `a` | 1 | 80.00 (n=1) | 60.00 (n=1) | 30.00 | 10.00 (n=1) | 1 |",
        "| 2 | `b` | 1 | 70.00 (n=1) | 66.00 (n=1) | 24.00 | 10.00 (n=1) | 1 |",
        "| 3 | `c` | 1 | 60.00 (n=1) | – | – | – | – |"]
    assert "- best `forgetting` (lowest): `a`, `b` with 10.00 (n=1)" in lines


def test_no_records_give_a_report_that_says_so():
    """Zero records: "no runs" in the title, zero counts, no time span, empty sections; catches a crash or a made-up
    count on an empty folder."""
    text = suite_report.render([], [], OUT)
    board = leaderboard.to_markdown(leaderboard.build([])).rstrip()
    assert text == "\n".join([
        "# Report: no runs", "",
        "Built from the 0 run records in `/r/out/runs/` only (0 finished, 0 failed): 0 scenario(s), 0 strategy "
        "row(s), seeds .", "",
        "## Summary per scenario", "", "## Plots", "", "## Leaderboard", "", board, "",
        "## Machine and code", "",
        "- machine: ", "- CPU: ", "- device: ; python ", "- packages: unknown", "- git commit(s) of the runs: ",
        "- code fingerprints (0):  (per row in leaderboard.csv)", ""])


def test_header_names_every_suite_spans_start_to_last_finish_and_counts_missing_training_time_as_zero():
    """Records of suites ``s`` and ``t``: the title joins both with ", "; the time span runs from the earliest start
    (2026-01-01T00:00) to the latest finish (2026-01-02T00:01, after the last start) and four finished runs without
    ``train_s`` (None or absent) add 0.0 min, not 4 s. Catches a lost or doubled separator, a span that ignores
    finish times or takes the second time, and missing training times counted as 1 s each."""
    records = [_record("a", 0, 80.0, 60.0, 30.0), _record("a", 1, 84.0, 64.0, 34.0),
               _record("b", 0, 70.0, 66.0, 10.0), _record("b", 1, 72.0, 68.0, 14.0)]
    for r in records[:2]:
        r["metrics"]["train_s"] = None
    for hour, r in zip((6, 8), records[2:]):                                # inside a's span, all times distinct
        del r["metrics"]["train_s"]
        r["spec"]["suite"] = "t"
        r["started"], r["finished"] = f"2026-01-01T0{hour}:00:00+00:00", f"2026-01-01T0{hour + 1}:00:00+00:00"
    assert suite_report.render(records, [], OUT).splitlines()[:3] == [
        "# Report: s, t", "",
        "Built from the 4 run records in `/r/out/runs/` only (4 finished, 0 failed): 1 scenario(s), 2 strategy "
        "row(s), seeds 0, 1. Runs from 2026-01-01T00:00:00+00:00 to 2026-01-02T00:01:00+00:00; 0.0 min of training "
        "in total."]


def test_an_offline_row_never_wins_forgetting_or_bwt():
    """Only ``last`` is compared over every row: a joint row carrying forgetting 0 and bwt 5 (better than both
    continual strategies) is left out of the best forgetting and bwt lines, which name ``b``. Catches the offline row
    pooled with the continual ones for every summary."""
    records = [*RECORDS[:4], _record("joint", 0, None, 90.0, None)]
    records[-1]["metrics"].update(forgetting=0.0, bwt=5.0)
    lines = suite_report.render(records, [], OUT).splitlines()
    assert [line for line in lines if line.startswith("- best")] == [
        "- best `avg_inc_acc` (highest): `a` with 82.00 ± 2.83",
        "- best `last_acc` (highest): `joint` with 90.00 (n=1)",
        "- best `forgetting` (lowest): `b` with 12.00 ± 2.83",
        "- best `bwt` (highest): `b` with -12.00 ± 2.83"]


def test_best_ties_only_within_one_billionth_and_text_cells_count_as_missing():
    """``_best`` keeps every row within an absolute 1e-9 of the best and no other: 100.0 and 100.0005 are not tied
    (a relative tolerance of 1e-5 would tie them), nor are 0.5 and 0.5 + 5e-9 (numpy's default atol 1e-8 would); a
    text cell ("–", as in a table read back from markdown) is skipped, not an error. Catches a default tolerance
    and a crash on a cell that is not a number."""
    rows = pd.DataFrame({"strategy": ["p", "q", "r", "s"], "x": [100.0, 100.0005, 100.0005 - 1e-10, 50.0],
                         "y": [0.5, 0.5 + 5e-9, 0.5 + 5e-10, 0.7], "z": ["–", 2.0, 3.0, 3.0]})
    assert list(suite_report._best(rows, "x", 1)["strategy"]) == ["q", "r"]
    assert list(suite_report._best(rows, "x", -1)["strategy"]) == ["s"]
    assert list(suite_report._best(rows.iloc[:3], "y", -1)["strategy"]) == ["p", "r"]
    assert list(suite_report._best(rows, "z", 1)["strategy"]) == ["r", "s"]
    assert list(suite_report._best(rows, "z", -1)["strategy"]) == ["q"]


def test_write_reads_the_folder_and_draws_the_plots_it_links(tmp_path):
    """``write`` with no records reads ``<out>/runs``, with no plots draws them into ``<out>/plots``, writes
    ``report.md`` there and returns its path; every image it links exists. Catches defaults that are ignored
    (records or plots) and links to files that were not written."""
    (tmp_path / "runs").mkdir()
    record = sealed(_record("a", 0, 80.0, 60.0, 30.0))
    (tmp_path / "runs" / "sc__a__s0.json").write_text(json.dumps(record))
    path = suite_report.write(tmp_path)
    assert path == tmp_path / "report.md"
    text = path.read_text()
    assert text == suite_report.render([record], sorted((tmp_path / "plots").iterdir()), tmp_path)
    links = re.findall(r"\]\((plots/[^)]+\.png)\)", text)
    assert links == ["plots/sc__accuracy.png", "plots/sc__a__accuracy__matrix.png"]
    assert all((tmp_path / link).is_file() for link in links)
    given = suite_report.write(tmp_path, [record], [])
    assert "## Plots\n\n### sc\n\n\n\n## Leaderboard" in given.read_text()


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


def test_a_records_environment_names_the_cpu_and_the_kernels_torch_picks_on_it():
    """Intel and AMD hosts give different numbers for some strategies: every record's ``env`` says which CPU and
    which of torch's kernel sets (``torch.backends.cpu.get_cpu_capability()``) ran it, whatever the device."""
    import torch

    from clbench.environment import environment

    env = environment(torch.device("cpu"))
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu_capability"]
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
    assert env["cpu_model"] == model or model is None and env["cpu_model"]


def _adequacy(step1_acc: float) -> list[dict]:
    """A record's adequacy entries: step 1's training accuracy ``step1_acc`` (flagged below 1.5/k = 0.75)."""
    return [{"experience": 0, "train_acc": 0.9, "k": 2, "epochs": 5, "loss_drop": 0.0},
            {"experience": 1, "train_acc": step1_acc, "k": 2, "epochs": 5, "loss_drop": 0.0}]


def test_flagged_rows_say_so_beside_their_numbers_and_in_a_flags_column():
    """One seed of ``b`` and one of ``joint`` not learned (step 1 at 0.1 < 1.5/2): every best line naming them and
    the joint upper bound carry `` [flag]``, the ranking table gains a ``flags`` column (empty for ``a``) and the
    notes point to the legend. Catches the flags lost from the summary (column, cells, note, markers)."""
    records = json.loads(json.dumps(RECORDS))
    for r in records:
        if r["status"] == "finished":
            r["adequacy"] = _adequacy(0.1 if r["run_id"] in ("sc__b__s0", "sc__joint__s1") else 0.9)
    flag = "[not learned (1/2 seeds; step 2; train)]"
    lines = suite_report.render(records, [], OUT).splitlines()
    start = lines.index("- best `avg_inc_acc` (highest): `a` with 82.00 ± 2.83")
    assert lines[start:start + 13] == [
        "- best `avg_inc_acc` (highest): `a` with 82.00 ± 2.83",
        f"- best `last_acc` (highest): `joint` {flag} with 91.00 ± 1.41",
        f"- best `forgetting` (lowest): `b` {flag} with 12.00 ± 2.83",
        f"- best `bwt` (highest): `b` {flag} with -12.00 ± 2.83",
        f"- joint upper bound: `joint`, `last_acc` 91.00 ± 1.41 {flag}", "",
        "| rank | strategy | seeds | avg_inc_acc | last_acc | gap to joint (last_acc) | forgetting | forgetting rank "
        "| flags |",
        "|---|---|---|---|---|---|---|---|---|",
        "| 1 | `a` | 2 | 82.00 ± 2.83 | 62.00 ± 2.83 | 29.00 | 32.00 ± 2.83 | 2 |  |",
        f"| 2 | `b` | 2 | 71.00 ± 1.41 | 67.00 ± 1.41 | 24.00 | 12.00 ± 2.83 | 1 | {flag[1:-1]} |", "",
        "Gap to joint: `last_acc` of `joint` minus the strategy's (positive: below the upper bound). Forgetting rank 1 "
        "= least forgetting. Flags: see the legend under the leaderboard.", ""]
    assert suite_report._flagged(pd.Series({"flags": math.nan})) == suite_report._flagged(pd.Series({})) == ""


def test_the_report_reads_flags_from_training_logs_under_its_folder(tmp_path):
    """A record without ``adequacy`` is flagged from its committed training log under the report's folder (epoch
    losses 1.0 ... 0.2: a drop of 0.2 >= 0.05 in the last fifth): catches the folder not passed to the
    leaderboard."""
    record = _record("a", 0, 80.0, 60.0, 30.0)
    log = tmp_path / "artifacts" / record["run_id"] / "training_log.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps({"member": "", "experience": 0, "epoch": e, "step": e, "loss": loss}) + "\n"
                           for e, loss in enumerate([1.0, 0.8, 0.6, 0.4, 0.2])))
    text = suite_report.render([record], [], tmp_path)
    assert "| 1 | `a` | 1 | 80.00 (n=1) | 60.00 (n=1) | 30.00 (n=1) | 1 | not converged (1/1 seeds; step 1; log) |" \
        in text.splitlines()


def test_training_curves_are_linked_for_the_runs_that_have_one(tmp_path):
    """The "Training curves" section lists, sorted, a link per run whose ``artifacts/<run_id>/training_curve.png``
    exists (named by the run), between the plots and the leaderboard; none without any. Catches the section's
    text, its order or the files it looks for changed."""
    records = [_record("b", 0, 70.0, 66.0, 10.0), _record("a", 0, 80.0, 60.0, 30.0), _record("c", 0, 1.0, 1.0, 0.0)]
    assert "## Training curves" not in suite_report.render(records, [], tmp_path)
    for run_id in ("sc__b__s0", "sc__a__s0"):
        (tmp_path / "artifacts" / run_id).mkdir(parents=True)
        (tmp_path / "artifacts" / run_id / "training_curve.png").write_bytes(b"png")
    (tmp_path / "artifacts" / "sc__c__s0").mkdir()
    lines = suite_report.render(records, [], tmp_path).splitlines()
    start = lines.index("## Training curves")
    assert lines[start - 1:start + 8] == [
        "", "## Training curves", "",
        "Loss and learning rate per epoch of each run (the numbers: `training_log.jsonl` beside each plot):", "",
        "- [sc__a__s0](artifacts/sc__a__s0/training_curve.png)",
        "- [sc__b__s0](artifacts/sc__b__s0/training_curve.png)", "", "## Leaderboard"]


def test_a_cpu_without_a_recorded_kernel_set_says_unknown():
    """A record from before ``cpu_capability`` was recorded names its CPU with kernels "unknown"."""
    record = _record("a", 0, 80.0, 60.0, 30.0)
    record["env"] = {**ENV, "cpu_capability": None}
    assert dict(suite_report.provenance([record]))["CPU"] == "Test CPU (torch CPU kernels: unknown)"


def test_labels_reasons_and_machine_names_are_copied_literally():
    """A scenario label, strategy label, failure reason, machine and suite that would end a table, link, inject HTML,
    break a code span or a line: headings and text escaped (:func:`clbench.escaping.markdown_text`), names as code
    spans with a longer fence (a ``|`` escaped only in a table cell)."""
    env = {**ENV, "machine": "m <b>x</b> [a](b)"}
    hostile = {"spec": {"suite": "s*", "scenario": {"name": "sc", "label": "x|<img src=y>", "args": {}},
                        "strategy": {"name": "naive", "label": "a`b|c", "preset": "cpu", "args": {}}},
               "env": env}
    good = {**_record("naive", 0, 80.0, 60.0, 30.0), **hostile}
    bad = {**_record("naive", 1, None, 0.0, None, status="failed", reason="boom\n<script>x</script>"), **hostile}
    lines = suite_report.render([good, bad], [], OUT).splitlines()
    assert lines[0] == "# Report: s\\*"
    assert "### x\\|\\<img src=y\\>" in lines
    assert "- best `avg_inc_acc` (highest): ``a`b|c`` with 80.00 (n=1)" in lines
    assert "| 1 | ``a`b\\|c`` | 1 | 80.00 (n=1) | 60.00 (n=1) | 30.00 (n=1) | 1 |" in lines
    assert "- `sc__naive__s1`: boom \\<script\\>x\\</script\\>" in lines
    assert "- machine: m \\<b\\>x\\</b\\> [a]\\(b)" in lines
    assert "Machine: m \\<b\\>x\\</b\\> [a]\\(b)" in lines                           # the leaderboard's line
