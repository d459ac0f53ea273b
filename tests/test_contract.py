"""The written strategy contract: every registered strategy x preset builds, trains two experiences, predicts finite
scores of the right shape and reports consistent parameter counts (timm's registry-wide style); a class that breaks
the contract is refused when it registers, a wrong return value fails the run with a message naming the strategy."""

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from clbench.config import build_config
from clbench.errors import ConfigError
from clbench.protocol import (
    CLASSIFICATION,
    NEXT_ITEM,
    ParamCount,
    Scenario,
    StrategyBase,
    StrategyContractError,
    check_strategy,
    hooks_checked,
)
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.runner import seed_everything
from clbench.scenarios.movielens import sequences_scenario
from clbench.typecheck import only_with, setting

SYNTHETIC = {"n_classes": 4, "n_experiences": 2, "train_per_class": 10, "test_per_class": 5}
VIT = {"embed_dim": 8, "depth": 1, "num_heads": 2, "patch_size": 4}
TINY = {"epochs": 1, "first_epochs": None, "finetune_epochs": 1, "batch_size": 6, "eval_batch_size": 64,
        "mem_size": 24, "n_shards": 2, "lr": 0.01, "augment": (), "arch_overrides": VIT,
        "size": 2}                         # PETL r / l: the defaults (r = 512) are refused above the width d = 8


def _accepted(name: str, preset: str, field: str, value) -> bool:
    try:
        build_config(name, preset, {field: value})
    except ConfigError:
        return False
    return True


def _tiny(name: str, preset: str) -> dict:
    """Tiny overrides for the fields this strategy's Config has and accepts (nlft refuses shards; a ViT for tangent
    strategies, an MLP otherwise)."""
    fields = {f.name for f in dataclasses.fields(STRATEGIES.get(name).Config)}
    overrides = {k: v for k, v in TINY.items() if k in fields and _accepted(name, preset, k, v)}
    if "model_args" in fields:
        overrides["model_args"] = {"hidden": [8]} if "model" in fields else VIT
    return overrides


NEXT_ITEM_ROWS = np.array([(u, (u + t) % 8 + 1, 1, 100 * t + u) for u in range(6) for t in range(8)])
TINY_SCENARIOS = {CLASSIFICATION: lambda: SCENARIOS.get("synthetic")(seed=0, **SYNTHETIC),
                  NEXT_ITEM: lambda: sequences_scenario(NEXT_ITEM_ROWS, 2, max_len=4, n_items=8)}
"""A tiny scenario of every kind a shipped strategy serves (items as columns for next-item)."""


def scenario_for(name: str) -> Scenario:
    """A tiny scenario of the first kind strategy ``name`` declares it serves (``scenario_kinds``)."""
    return TINY_SCENARIOS[STRATEGIES.get(name).scenario_kinds[0]]()


CASES = [(name, preset) for name in STRATEGIES.names() if STRATEGIES.get(name).__module__.startswith("clbench.")
         for preset in STRATEGIES.get(name).PRESETS]


@pytest.mark.parametrize("name, preset", CASES)
def test_every_strategy_and_preset_trains_two_experiences_and_predicts(name, preset):
    torch.set_num_threads(1)
    seed_everything(0)
    scenario = scenario_for(name)
    cls = STRATEGIES.get(name)
    strategy = cls(scenario.info, "cpu", build_config(name, preset, _tiny(name, preset)))
    assert isinstance(strategy, StrategyBase)
    experiences = list(scenario.train_stream)
    counts = []
    for i, step in enumerate([experiences] if cls.offline else experiences):
        with hooks_checked(strategy, i):                 # an optimizer step fires the batch hooks
            strategy.train(step)
        counts.append(strategy.num_parameters())
    x = torch.stack([scenario.test_stream[1].dataset.eval()[i][0] for i in range(6)])
    scores = strategy.predict(x, torch.zeros(6, dtype=torch.long))
    assert isinstance(scores, torch.Tensor) and scores.shape[0] == 6 and scores.shape[1] >= 4
    assert torch.isfinite(scores[:, :4]).all()
    for count in counts:
        assert isinstance(count, ParamCount) and 0 < count.trainable <= count.total
    modules = strategy.modules()
    assert modules and all(isinstance(m, torch.nn.Module) for m in modules.values())
    extra = strategy.extra_metrics()
    assert isinstance(extra, dict) and all(isinstance(v, (int, float)) for v in extra.values())


def test_conformance_covers_every_shipped_strategy_and_every_kind_they_serve():
    assert {n for n, _ in CASES} == {n for n in STRATEGIES.names() if STRATEGIES.get(n).__module__.startswith(
        "clbench.")} and len(CASES) >= 2 * 16
    assert {k for n, _ in CASES for k in STRATEGIES.get(n).scenario_kinds} == set(TINY_SCENARIOS)


@dataclass
class _Cfg:
    lr: float = 0.1


@dataclass
class _UsedWithNothing:
    lr: float = setting(0.1, only_with=only_with("optimizer", "sgd"))


class _Good(StrategyBase):
    Config = _Cfg
    PRESETS = {"cpu": {"lr": 0.01}}

    def train(self, experience):
        pass

    def predict(self, x, task_labels):
        return torch.zeros(len(x), 4)

    def num_parameters(self):
        return ParamCount(1, 1)


@pytest.mark.parametrize("make, message", [
    (lambda: type("NotBase", (), {}), "must be a class deriving from clbench.protocol.StrategyBase"),
    (lambda: type("NoPredict", (StrategyBase,), {"Config": _Cfg, "train": _Good.train,
                                                 "num_parameters": _Good.num_parameters}),
     "does not implement predict"),
    (lambda: type("NoConfig", (_Good,), {"Config": dict}), "Config must be a dataclass"),
    (lambda: type("BadPreset", (_Good,), {"PRESETS": {"cpu": {"lr": 0.1, "epochs": 3}}}),
     r"preset 'cpu' sets unknown Config fields \['epochs'\]"),
    (lambda: type("NoKinds", (_Good,), {"scenario_kinds": ()}), "scenario_kinds must be a non-empty tuple"),
    (lambda: type("KindString", (_Good,), {"scenario_kinds": "next_item"}), "scenario_kinds must be a non-empty"),
    (lambda: type("BadNeeds", (_Good,), {"private_needs": ("mem_size",)}),
     "private_needs must be a tuple of clbench.protocol.PrivateNeed"),
    (lambda: type("UsedWithNothing", (_Good,), {"Config": _UsedWithNothing}),
     "Config field 'lr' is declared used only with 'optimizer', which is not a field of _UsedWithNothing"),
])
def test_registration_refuses_a_class_that_breaks_the_contract(make, message):
    cls = make()
    with pytest.raises(StrategyContractError, match=rf"strategy 'x' \(.*\) {message}|strategy 'x' \(.*\): {message}"):
        check_strategy("x", cls)
    check_strategy("x", _Good)          # the well-formed one passes


def test_wrong_return_type_fails_the_run_naming_the_strategy(tmp_path, registered):
    from clbench.runner import execute
    from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry

    class IntCount(_Good):
        def num_parameters(self):
            return 5

    registered(STRATEGIES, "test_int_count", IntCount)
    record = execute(RunSpec("t", ScenarioEntry("synthetic", SYNTHETIC), StrategyEntry("test_int_count"), 0, "cpu"))
    assert record.status == "failed"
    assert record.reason == ("StrategyContractError: IntCount.num_parameters() returned int, expected ParamCount "
                             "(see clbench.protocol.StrategyBase).")
