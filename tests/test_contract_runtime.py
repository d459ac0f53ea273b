"""Contract violations that only show when a strategy runs are named as such by the runner: a subclass that skips
``super().__init__`` and a ``train`` that steps an optimizer without firing the batch hooks (its own loop: no NaN
guard, no private step, no training log). A strategy that learns without an optimizer is not one."""

import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from clbench import api
from clbench.cl.data import experience_tensors
from clbench.protocol import ParamCount, StrategyBase
from clbench.registry import STRATEGIES

SCENARIO = {"train_per_class": 6, "test_per_class": 3}


@dataclass
class Config:
    lr: float = 0.1


class Linear(StrategyBase):
    Config = Config
    PRESETS = {"cpu": {}}

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), info.n_classes))

    def train(self, experience):
        x, y = experience_tensors(experience)
        optimizer = torch.optim.SGD(self.net.parameters(), lr=self.config.lr)
        for _ in range(3):                                   # its own loop, no callbacks
            optimizer.zero_grad()
            F.cross_entropy(self.net(x), y).backward()
            optimizer.step()

    @torch.no_grad()
    def predict(self, x, task_labels):
        return self.net(x)

    def num_parameters(self):
        return ParamCount.of(self.net)


class NoSuper(Linear):
    def __init__(self, info, device, config):                # forgets super().__init__
        self.config = config
        self.net = nn.Linear(math.prod(info.input_shape), info.n_classes)


class Means(Linear):
    """Class means, no optimizer: nothing to fire hooks for."""

    def train(self, experience):
        x, y = experience_tensors(experience)
        with torch.no_grad():
            for c in y.unique():
                self.net[1].weight[c] = x[y == c].flatten(1).mean(0)


@pytest.fixture
def registered():
    names = {"test_own_loop": Linear, "test_no_super": NoSuper, "test_means": Means}
    for name, cls in names.items():
        STRATEGIES.register(name)(cls)
    yield
    for name in names:
        del STRATEGIES._entries[name], STRATEGIES.origins[name]


def _run(name):
    return api.run("synthetic", name, preset="cpu", device="cpu", scenario_args=SCENARIO)


def test_a_loop_that_bypasses_the_callbacks_is_a_contract_violation(registered):
    record = _run("test_own_loop")
    assert record.status == "failed"
    assert record.reason == ("StrategyContractError: Linear.train() took 3 optimizer step(s) on experience 0 without "
                             "firing the batch hooks: train through clbench.training.fit(..., "
                             "callbacks=self.callbacks) or clbench.callbacks.bridge(template, self.callbacks) (see "
                             "clbench.protocol.StrategyBase).")


def test_a_skipped_super_init_is_named(registered):
    record = _run("test_no_super")
    assert record.status == "failed"
    assert record.reason.startswith("StrategyContractError: NoSuper.__init__ did not call super().__init__(info, "
                                    "device, config), which sets self.")


def test_learning_without_an_optimizer_needs_no_hooks(registered):
    assert _run("test_means").status == "finished"
