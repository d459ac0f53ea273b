"""A well-formed minimal strategy for tests of the strategy contract (registration checks, runtime checks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clbench.protocol import ParamCount, StrategyBase


@dataclass
class Cfg:
    lr: float = 0.1


class Good(StrategyBase):
    Config = Cfg
    PRESETS = {"cpu": {"lr": 0.01}}

    def train(self, experience):
        pass

    def predict(self, x, task_labels):
        return torch.zeros(len(x), 4)

    def num_parameters(self):
        return ParamCount(1, 1)
