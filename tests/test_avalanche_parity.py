"""clbench adds no distortion: its accuracy matrix equals what Avalanche's own evaluation reports for the same
trained strategies (Top1_Acc_Exp per test experience), for every wrapped Avalanche strategy that has its own
prediction path or training loop: replay, iCaRL, dark experience replay, and the regularization and rehearsal
strategies of ``clbench.strategies.regularization`` / ``clbench.strategies.rehearsal``. Avalanche's evaluation runs
the plugins' eval hooks (BiC's bias layer, CoPE's nearest prototype), which clbench's ``predict`` must reproduce.

One documented difference: dark experience replay needs a fixed-width head, and Avalanche's accuracy takes the argmax
over all its units, classes not yet seen included, while clbench scores the classes seen so far (the class-IL
definition in DESIGN.md). The two can only differ on future experiences ``j > i``, which no metric
reads; for heads that grow with the classes (replay, iCaRL's nearest-mean classifier) the whole matrix is equal.
CoPE is compared on the experiences seen so far: Avalanche's evaluation computes its PPP loss, which needs a
prototype for every class evaluated, and prototypes exist for seen classes only (future experiences score 0 in
clbench by definition).
"""

import os

import pytest
import torch
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin

import clbench.strategies.baselines as baselines
from clbench.config import build_config
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.runner import seed_everything


def _with_accuracy(*_, **__):
    return EvaluationPlugin(accuracy_metrics(experience=True), loggers=[])


SCENARIOS_USED = {"split_digits": {}, "split_mnist": {"max_per_class": 60}}   # split_mnist needs $CLBENCH_DATA
TINY = {"epochs": 1, "model_args": {"hidden": [64]}}
# name -> (hyperparameters beyond TINY, which experiences are compared: "all" or the "seen" ones j <= i)
CASES = {
    "replay": ({"mem_size": 60}, "all"),
    "icarl": ({"mem_size": 60}, "all"),
    "der_dark": ({"mem_size": 60}, "seen"),
    "si": ({}, "all"),
    "mas": ({}, "all"),
    "rwalk": ({}, "all"),
    "lfl": ({}, "all"),
    "ewc_online": ({}, "all"),
    "gem": ({"patterns_per_exp": 12}, "all"),
    "agem": ({"patterns_per_exp": 12, "sample_size": 24}, "all"),
    "er_ace": ({"mem_size": 60}, "all"),
    "er_aml": ({"mem_size": 160, "batch_size": 16}, "all"),     # >= batch_size memories per class
    "mir": ({"mem_size": 60, "subsample": 20}, "all"),
    "gss": ({"mem_size": 60, "mem_strength": 2}, "all"),
    "bic": ({"mem_size": 60, "stage_2_epochs": 5}, "all"),
    "cope": ({"mem_size": 60, "alpha": 0.5}, "seen"),          # its eval loss needs prototypes of the classes
    "feature_replay": ({"mem_size": 60}, "all"),
    "mer": ({"mem_size": 60, "n_inner_steps": 1}, "all"),
}
FULL_DATA = {"replay", "icarl", "der_dark", "bic", "cope", "feature_replay"}   # also on MNIST: own prediction paths


@pytest.mark.parametrize("name, scenario_name", [(name, scenario) for name in CASES for scenario in SCENARIOS_USED
                                                 if scenario == "split_digits" or name in FULL_DATA])
def test_accuracy_matrix_equals_avalanche_metrics(name, scenario_name, monkeypatch):
    if scenario_name == "split_mnist" and not os.environ.get("CLBENCH_DATA"):
        pytest.skip("split_mnist needs real data: set CLBENCH_DATA to a root holding mnist/ (e.g. ../shared/data)")
    args, compared = CASES[name]
    monkeypatch.setattr(baselines, "EvaluationPlugin", _with_accuracy)
    seed_everything(0)
    scenario = SCENARIOS.get(scenario_name)(seed=0, **SCENARIOS_USED[scenario_name])
    config = build_config(name, "cpu", {**TINY, **args})
    strategy = STRATEGIES.get(name)(scenario.info, torch.device("cpu"), config)
    for i, experience in enumerate(scenario.train_stream):
        strategy.train(experience)
        ours = scenario.evaluator(strategy, scenario, i, torch.device("cpu")).rows["accuracy"]
        upto = len(ours) if compared == "all" else i + 1
        theirs = strategy.template.eval(scenario.test_stream[:upto])
        avalanche_row = [theirs[f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{j:03d}"] for j in range(upto)]
        assert ours[:upto] == pytest.approx(avalanche_row, abs=1e-12), f"step {i}"
