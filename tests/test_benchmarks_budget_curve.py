"""benchmarks/budget_curve.py: validation scores after every epoch of a suite's rows, the test data
unread, the training left as it would be without the scoring, and the flattening rule."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from clbench.protocol import NEXT_ITEM
from clbench.registry import SCENARIOS
from tests._scripts import benchmark_script

SUITE = """suite: curve
scenarios:
  - {name: split_digits, label: digits, args: {n_experiences: 5}}
strategies:
  - {name: naive, preset: cpu}
  - {name: replay, preset: cpu, args: {mem_size: 100}}
"""


@pytest.fixture(scope="module")
def budget_curve():
    yield from benchmark_script("budget_curve")


def test_every_epoch_of_every_step_is_scored_on_the_validation_data(tmp_path, capsys, budget_curve):
    (tmp_path / "s.yaml").write_text(SUITE)
    assert budget_curve.main([str(tmp_path / "s.yaml"), "digits", "naive", "replay", "--epochs", "2",
                              "--steps", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [json.loads(line) for line in out if line.startswith("{")]
    assert [(r["row"], r["step"], r["epoch"]) for r in lines] == [
        (row, step, epoch) for row in ("naive", "replay") for step in (0, 1) for epoch in (1, 2)]
    assert {k for r in lines for k in r} == {"event", "scenario", "row", "seed", "step", "epoch", "metric", "holdout",
                                             "trajectory", "just_trained", "seen", "sizes", "train_s", "eval_s"}
    valid = [len(e.dataset) for e in SCENARIOS.get("split_digits")(holdout="valid").test_stream]
    test = [len(e.dataset) for e in SCENARIOS.get("split_digits")().test_stream]
    assert valid != test
    for r in lines:
        assert r["sizes"] == valid[:r["step"] + 1] and r["holdout"] == "valid" and r["metric"] == "accuracy"
        assert 0 <= r["seen"] <= 100 and 0 <= r["just_trained"] <= 100
    assert "| epoch | naive step 0 | naive step 1 | replay step 0 | replay step 1 |" in out
    assert sum(line.startswith("- naive, step ") for line in out) == 2


def test_scoring_after_every_epoch_leaves_the_training_as_it_was(tmp_path, budget_curve):
    (tmp_path / "s.yaml").write_text(SUITE)
    spec = budget_curve.row_specs(str(tmp_path / "s.yaml"), "digits", ["replay"], 2, 0, None)[0]
    scored = budget_curve.run_row(spec, 2, every_epoch=True)
    plain = budget_curve.run_row(spec, 2, every_epoch=False)
    assert len(scored.points[1]) == 2 and len(plain.points[1]) == 1
    weights = [c.strategy.model.state_dict() for c in (scored, plain)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert scored.points[1][-1][1:] == plain.points[1][0][1:]
    assert scored.strategy.model.training == plain.strategy.model.training


def test_a_row_with_an_observer_callback_is_curved_without_it(tmp_path, budget_curve):
    """model_snapshot needs a run's output folder, which a curve has not: the suite's rows that keep their final
    model (dp_seqrec_games_paper's) failed before training. Observers change neither the training nor the scores,
    so the curve leaves them out; a callback that changes the training is kept."""
    (tmp_path / "s.yaml").write_text(SUITE.replace("args: {mem_size: 100}}",
                                                   "args: {mem_size: 100}, callbacks: [model_snapshot]}"))
    spec, = budget_curve.row_specs(str(tmp_path / "s.yaml"), "digits", ["replay"], 1, 0, None)
    assert [c["name"] for c in spec.strategy.callbacks] == ["model_snapshot"]
    curve = budget_curve.run_row(spec, 1, every_epoch=False)
    assert 0 < curve.points[0][0][1] <= 100
    assert not any(type(c).__name__ == "ModelSnapshot" for c in curve.strategy.callbacks.callbacks)


def test_the_rows_are_the_suites_entries_with_a_validation_holdout_and_the_epochs(tmp_path, budget_curve):
    (tmp_path / "s.yaml").write_text(SUITE)
    spec, = budget_curve.row_specs(str(tmp_path / "s.yaml"), "digits", ["replay"], 7, 3, 0.2)
    assert spec.scenario.args == {"n_experiences": 5, "holdout": "valid", "valid_fraction": 0.2}
    assert spec.strategy.args == {"mem_size": 100, "epochs": 7} and spec.seed == 3


@pytest.mark.parametrize(("just", "flat"), [
    ([10, 20, 30, 30.5, 30, 31, 30.8, 30.2, 30.9, 30.1], 3),     # within 1 point of every later epoch from 3
    ([10, 20, 30, 30, 30, 30, 30, 30, 30, 35], None),             # a late rise: not flat
    ([10, 20, 30, 31, 32, 33, 34, 35, 36, 37], None),             # still rising at E
    ([50, 50, 50, 50, 50, 50, 50, 50, 50, 50], 1),
    ([10, 20, 30, 40, 50, 60, 70, 80, 80, 80], 8),                # 8 is the last epoch with 20% of E after it
    ([10, 20, 30, 40, 50, 60, 70, 80, 90, 90], None),
])
def test_the_flattening_epoch(just, flat, budget_curve):
    points = [(e + 1, j, 0.0) for e, j in enumerate(just)]
    assert budget_curve.flattening_epoch(points, tolerance=1.0, tail=0.2) == flat


@SCENARIOS.register("test_curve_cycles")
def cycles(*, seed: int = 0, holdout: str = "test"):
    """Each user walks 12 items in a cycle from its own start (next-item, learnable; NDCG@10 is its metric)."""
    from clbench.scenarios.movielens import sequences_scenario
    rows = [(u, (u + t) % 12 + 1, 1, 1000 * t + u) for u in range(30) for t in range(10)]
    return sequences_scenario(np.array(rows), 1, max_len=6, holdout=holdout, n_items=12)


cycles.kind = NEXT_ITEM
SEQREC_SUITE = """suite: curve_seqrec
scenarios:
  - {name: test_curve_cycles, label: cycles}
strategies:
  - {name: seqrec, args: {dim: 8, batch_size: 16, lr: 0.01, dropout: 0.0}}
"""


def test_a_metric_not_in_percent_needs_its_own_tolerance_and_keeps_its_decimals(tmp_path, capsys, budget_curve):
    (tmp_path / "s.yaml").write_text(SEQREC_SUITE)
    argv = [str(tmp_path / "s.yaml"), "cycles", "seqrec", "--epochs", "3"]
    assert budget_curve.main(argv) == 2
    assert "not in percent: pass --tolerance" in capsys.readouterr().err
    assert budget_curve.main([*argv, "--tolerance", "0.001"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [json.loads(line) for line in out if line.startswith("{")]
    assert [r["metric"] for r in lines] == ["ndcg@10"] * 3 and all(0 <= r["just_trained"] <= 1 for r in lines)
    cells = [line.split(" | ")[1] for line in out if line.startswith("| ") and line[2].isdigit()]
    assert len(cells) == 3 and all(re.fullmatch(r"\d\.\d{4} / \d\.\d{4}", c.rstrip(" |")) for c in cells)
    assert cells[0].startswith(f"{lines[0]['just_trained']:.4f}")


def test_a_private_row_calibrated_from_epsilon_is_refused_every_epoch_and_taken_with_at(tmp_path, capsys,
                                                                                         budget_curve):
    private = SEQREC_SUITE.replace("dropout: 0.0}}", "dropout: 0.0}, dp: {epsilon: 8.0, clip: 1.0}}")
    (tmp_path / "s.yaml").write_text(private)
    argv = [str(tmp_path / "s.yaml"), "cycles", "seqrec", "--tolerance", "0.001"]
    assert budget_curve.main([*argv, "--epochs", "2"]) == 2
    assert "calibrates its noise from epsilon" in capsys.readouterr().err
    assert budget_curve.main([*argv, "--at", "1,2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["epoch"] for r in lines] == [1, 2]


def test_a_private_rows_trajectory_is_every_epoch_of_one_run_whose_last_point_is_that_budget(tmp_path, capsys,
                                                                                               budget_curve):
    """--trajectory scores every epoch of the one E-epoch run of a row calibrated from epsilon (its course, as Ding
    et al.'s Figure 4 plots it), says so in every line and reads no flattening from it; its last point is the
    E-epoch budget that --at E trains (the scoring leaves the run as it would be)."""
    private = SEQREC_SUITE.replace("dropout: 0.0}}", "dropout: 0.0}, dp: {epsilon: 8.0, clip: 1.0}}")
    (tmp_path / "s.yaml").write_text(private)
    argv = [str(tmp_path / "s.yaml"), "cycles", "seqrec", "--tolerance", "0.001"]
    assert budget_curve.main([*argv, "--epochs", "3", "--trajectory"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [json.loads(line) for line in out if line.startswith("{")]
    assert [(r["epoch"], r["trajectory"]) for r in lines] == [(1, True), (2, True), (3, True)]
    assert "- seqrec, step 0: the course of one 3-epoch run (--trajectory): its epochs are not budgets" in out[-1]
    assert budget_curve.main([*argv, "--at", "3"]) == 0
    (budget,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert budget["trajectory"] is False and budget["just_trained"] == lines[-1]["just_trained"]
    with pytest.raises(SystemExit):
        budget_curve.main([*argv, "--at", "3", "--trajectory"])


def test_a_row_whose_training_never_fires_the_epoch_hook_is_refused_not_dropped(tmp_path, capsys, budget_curve):
    """taft trains its members with callbacks rebuilt from their specs: no per-epoch point can be scored, and the
    row must say so (it used to vanish from the table)."""
    (tmp_path / "s.yaml").write_text(SUITE.replace("{name: naive, preset: cpu}", "{name: taft, preset: cpu}"))
    assert budget_curve.main([str(tmp_path / "s.yaml"), "digits", "taft", "--epochs", "1", "--steps", "1"]) == 2
    assert "without the curve's epoch hook firing" in capsys.readouterr().err
    assert budget_curve.main([str(tmp_path / "s.yaml"), "digits", "taft", "--at", "1", "--steps", "1"]) == 0
    assert "| 1 | " in capsys.readouterr().out
