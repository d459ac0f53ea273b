"""A strategy of one's own that calls :func:`clbench.training.fit` without ``callbacks=`` still fires the run's
callbacks (:func:`clbench.training.strategy_training`, entered by the runner around ``strategy.train``): its training
log and artifacts are written and a non-finite loss fails the run. Outside a run, ``fit`` fires none."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from clbench import api
from clbench.callbacks import Callback, CallbackList
from clbench.cl.data import experience_tensors
from clbench.protocol import ParamCount, StrategyBase
from clbench.registry import STRATEGIES
from clbench.training import FitSettings, fit, strategy_training
from clbench.typecheck import RangeChecked

SCENARIO = {"train_per_class": 10, "test_per_class": 5}


@dataclass
class ForgetfulConfig(RangeChecked):
    epochs: int = 2
    poison: bool = False        # a NaN in the loss from the first batch on


class Forgetful(StrategyBase):
    """A linear classifier trained by ``fit`` without ``callbacks=`` (the author forgot them)."""

    Config = ForgetfulConfig
    PRESETS = {"cpu": {}}

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), info.n_classes))

    def train(self, experience):
        x, y = experience_tensors(experience)
        poison = float("nan") if self.config.poison else 0.0
        fit(self.model, self.model, self.model.parameters(), x, y, lambda out, t: F.cross_entropy(out, t) + poison,
            FitSettings(self.config.epochs, 8, 0.01), seed=0)

    @torch.no_grad()
    def predict(self, x, task_labels):
        return self.model(x)

    def num_parameters(self):
        return ParamCount.of(self.model)


def test_fit_without_callbacks_writes_the_training_log_and_artifacts_of_the_run(registered, tmp_path):
    registered(STRATEGIES, "forgetful", Forgetful)
    record = api.run("synthetic", "forgetful", scenario_args=SCENARIO, callbacks=["hook_trace"], out=tmp_path)
    assert record.status == "finished", record.reason
    artifacts = tmp_path / "artifacts" / record.run_id
    rows = [json.loads(line) for line in (artifacts / "training_log.jsonl").read_text().splitlines()]
    experiences = len(record.accuracy_matrix)
    assert [(r["experience"], r["epoch"]) for r in rows] == [(e, k) for e in range(experiences) for k in range(2)]
    hooks = [json.loads(line)["hook"] for line in (artifacts / "hooks.jsonl").read_text().splitlines()]
    assert hooks.count("on_batch_start") == sum(r["batches"] for r in rows) > 0


def test_fit_without_callbacks_keeps_the_nan_guard(registered, tmp_path):
    registered(STRATEGIES, "forgetful", Forgetful)
    record = api.run("synthetic", "forgetful", scenario_args=SCENARIO, args={"poison": True}, out=tmp_path)
    assert record.status == "failed" and "non-finite" in record.reason.lower()


def test_fit_fires_the_innermost_strategy_callbacks_and_none_outside_a_run():
    class Count(Callback):
        def __init__(self) -> None:
            self.batches = 0

        def on_batch_start(self, x, y) -> None:
            self.batches += 1

    def train(callbacks=None) -> None:
        model = nn.Linear(2, 2)
        fit(model, model, model.parameters(), torch.zeros(6, 2), torch.zeros(6, dtype=torch.long),
            F.cross_entropy, FitSettings(1, 3, 0.1), seed=0, callbacks=callbacks)

    outer, inner = CallbackList(), CallbackList()
    outer.callbacks.append(Count())
    inner.callbacks.append(Count())
    train()                                           # outside a run: nothing to fire
    with strategy_training(outer):
        train()
        with strategy_training(inner):
            train()
        train(CallbackList())                         # passed explicitly: that list, not the strategy's
    train()
    assert (outer.callbacks[0].batches, inner.callbacks[0].batches) == (2, 2)
