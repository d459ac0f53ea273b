"""clbench adds no distortion: its accuracy matrix equals what Avalanche's own evaluation reports for the same
trained strategies (Top1_Acc_Exp per test experience), for replay, iCaRL and dark experience replay.

One documented difference: dark experience replay needs a fixed-width head, and Avalanche's accuracy takes the argmax
over all its units, classes not yet seen included, while clbench scores the classes seen so far (the class-IL
definition in DESIGN.md). The two can only differ on future experiences ``j > i``, which no metric but ``fwt``
reads; for heads that grow with the classes (replay, iCaRL's nearest-mean classifier) the whole matrix is equal.
"""

import os

import pytest
import torch
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin

import clbench.strategies.baselines as baselines
from clbench.config import build_config
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.runner import evaluate, seed_everything


def _with_accuracy(*_, **__):
    return EvaluationPlugin(accuracy_metrics(experience=True), loggers=[])


SCENARIOS_USED = {"split_digits": {}, "split_mnist": {"max_per_class": 60}}   # split_mnist needs $CLBENCH_DATA


@pytest.mark.parametrize("scenario_name", list(SCENARIOS_USED))
@pytest.mark.parametrize("name, compared", [("replay", "all"), ("icarl", "all"), ("der_dark", "seen")])
def test_accuracy_matrix_equals_avalanche_metrics(name, compared, scenario_name, monkeypatch):
    if scenario_name == "split_mnist" and not os.environ.get("CLBENCH_DATA"):
        pytest.skip("split_mnist needs real data: set CLBENCH_DATA to a root holding mnist/ (e.g. ../shared/data)")
    monkeypatch.setattr(baselines, "EvaluationPlugin", _with_accuracy)
    seed_everything(0)
    scenario = SCENARIOS.get(scenario_name)(seed=0, **SCENARIOS_USED[scenario_name])
    config = build_config(name, "cpu", {"epochs": 1, "mem_size": 60, "model_args": {"hidden": [64]}})
    strategy = STRATEGIES.get(name)(scenario.info, torch.device("cpu"), config)
    for i, experience in enumerate(scenario.train_stream):
        strategy.train(experience)
        ours, _ = evaluate(strategy, scenario, i, torch.device("cpu"))
        theirs = strategy.template.eval(scenario.test_stream)
        avalanche_row = [theirs[f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{j:03d}"]
                         for j in range(len(ours))]
        upto = len(ours) if compared == "all" else i + 1
        assert ours[:upto] == pytest.approx(avalanche_row[:upto], abs=1e-12), f"step {i}"
