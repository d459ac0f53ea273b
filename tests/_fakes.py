"""Strategies with known outputs, registered for the tests (accuracy matrices can be computed by hand)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clbench.protocol import ParamCount
from clbench.registry import STRATEGIES


@dataclass
class FakeConfig:
    interrupt_at_seed: int = -1
    extra: float = 1.5


@STRATEGIES.register("test_increasing_logits")
class IncreasingLogits:
    """Scores class c with c: the runner's masking decides every prediction (the largest allowed class)."""

    offline = False
    Config = FakeConfig
    PRESETS = {"cpu": {}}

    def __init__(self, info, device, config):
        self.info, self.config, self.steps = info, config, 0
        self.weight = torch.nn.Parameter(torch.zeros(3))

    def train(self, experience):
        if torch.initial_seed() == self.config.interrupt_at_seed:
            raise KeyboardInterrupt
        self.steps += 1
        self.weight = torch.nn.Parameter(torch.zeros(3 + self.steps))   # grows by one parameter per step

    def predict(self, x, task_labels):
        return torch.arange(self.info.n_classes, dtype=torch.float32).expand(len(x), -1)

    def num_parameters(self):
        return ParamCount(total=self.weight.numel(), trainable=self.weight.numel())

    def extra_metrics(self):
        return {"answer": self.config.extra}
