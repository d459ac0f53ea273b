"""Every regularization and rehearsal strategy does something: at a strong setting, its accuracy matrix differs from
naive fine-tuning's on the same seed and scenario, and it learns the first experience.

A strategy whose extra term or memory silently does nothing trains exactly like naive (same seed, same batches,
same updates) and gives the same matrix to the last digit. Avalanche 0.6's synaptic intelligence did (its reference
weights were views of the live parameters, so every importance was 0); this guard catches that class of bug for
every strategy listed here. A strategy whose loss is silently 0 (or detached from the weights) learns nothing: the
first-experience check catches that class. A new regularization or rehearsal strategy is added to :data:`STRONG`.
"""

import pytest
import torch

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
