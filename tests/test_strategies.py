"""The shipped strategies of strategies/ as a family.

Every regularization and rehearsal strategy does something: at a strong setting, its accuracy matrix differs from
naive fine-tuning's on the same seed and scenario, and it learns the first experience.

A strategy whose extra term or memory silently does nothing trains exactly like naive (same seed, same batches,
same updates) and gives the same matrix to the last digit. Avalanche 0.6's synaptic intelligence did (its reference
weights were views of the live parameters, so every importance was 0); this guard catches that class of bug for
every strategy listed here. A strategy whose loss is silently 0 (or detached from the weights) learns nothing: the
first-experience check catches that class. A new regularization or rehearsal strategy is added to :data:`STRONG`.

clbench adds no distortion: its accuracy matrix equals what Avalanche's own evaluation reports for the same
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
clbench by definition)."""

import os

import pytest
import torch
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin

import clbench.strategies.baselines as baselines
from clbench.config import build_config
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.runner import seed_everything

TINY = {"epochs": 1, "model_args": {"hidden": [64]}}
MEMORY = 200                                        # samples (16% of split_digits' 1,257 training images)
STRONG = {
    "ewc": {"ewc_lambda": 1e4},
    "ewc_online": {"ewc_lambda": 1e4},
    "si": {"si_lambda": 1e4},
    "mas": {"lambda_reg": 100.0},
    "rwalk": {"ewc_lambda": 100.0},
    "lfl": {"lambda_e": 100.0},
    "lwf": {"alpha": 10.0},
    "replay": {"mem_size": MEMORY},
    "icarl": {"mem_size": MEMORY},
    "der_dark": {"mem_size": MEMORY},
    "gdumb": {"mem_size": MEMORY},
    "gem": {"patterns_per_exp": MEMORY // 5},
    "agem": {"patterns_per_exp": MEMORY // 5},
    "er_ace": {"mem_size": MEMORY},
    "er_aml": {"mem_size": MEMORY, "batch_size": 16},        # >= batch_size memories per class
    "mir": {"mem_size": MEMORY},
    "gss": {"mem_size": MEMORY, "mem_strength": 2},
    "bic": {"mem_size": MEMORY, "stage_2_epochs": 5},
    "cope": {"mem_size": MEMORY},
    "feature_replay": {"mem_size": MEMORY},
    "mer": {"mem_size": MEMORY, "n_inner_steps": 1, "beta": 1.0},   # one inner pass, no within-batch shrink: fast
}


def accuracy_matrix(name: str, args: dict) -> list[list[float]]:
    """Train ``name`` on split digits (seed 0) and return its accuracy matrix ``R[i][j]``."""
    seed_everything(0)
    scenario = SCENARIOS.get("split_digits")(seed=0)      # a fresh one: BiC rewrites its experiences' datasets
    strategy = STRATEGIES.get(name)(scenario.info, torch.device("cpu"), build_config(name, "cpu", {**TINY, **args}))
    rows = []
    for i, experience in enumerate(scenario.train_stream):
        strategy.train(experience)
        rows.append(scenario.evaluator(strategy, scenario, i, torch.device("cpu")).rows["accuracy"])
    return rows


@pytest.fixture(scope="module")
def naive() -> list[list[float]]:
    return accuracy_matrix("naive", {})


def test_naive_is_reproducible(naive):
    """The guard's premise: the same seed gives the same matrix, so any difference comes from the strategy."""
    assert accuracy_matrix("naive", {}) == naive


@pytest.mark.parametrize("name", list(STRONG))
def test_strategy_learns_and_differs_from_naive(name, naive):
    """Different from naive, and the first experience learnt (a loss that is silently 0 learns nothing: chance is
    0.5 on its two classes, naive reaches 0.97)."""
    matrix = accuracy_matrix(name, STRONG[name])
    assert matrix != naive, f"{name} at {STRONG[name]} trained exactly like naive"
    assert matrix[0][0] > 0.75, f"{name} did not learn experience 0: accuracy {matrix[0][0]:.3f}"


def test_every_regularization_and_rehearsal_strategy_is_guarded():
    """Strategies of the regularization and rehearsal families (any module) are all in STRONG."""
    families = {"clbench.strategies.regularization", "clbench.strategies.rehearsal"}
    registered = {name for name in STRATEGIES.names() if STRATEGIES.get(name).__module__ in families}
    assert registered <= set(STRONG), f"add a strong setting for {sorted(registered - set(STRONG))}"


def _with_accuracy(*_, **__):
    return EvaluationPlugin(accuracy_metrics(experience=True), loggers=[])


SCENARIOS_USED = {"split_digits": {}, "split_mnist": {"max_per_class": 60}}   # split_mnist needs $CLBENCH_DATA


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
