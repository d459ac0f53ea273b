"""A synthetic next-item ranking scenario and a transition-table strategy, registered for the tests: a
non-classification scenario that goes through the same runner, callbacks, leaderboard and plots.

Experience ``t`` has its own item permutation ``π_t`` (items ``0..n_items-1``); a sample is a window of
``history`` consecutive items along the cycle ``π_t`` and its target the next one, so the next item is a function
of the last item — a different function per experience, which a model trained on later experiences forgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from clbench.evaluation import RankingEvaluator
from clbench.protocol import ParamCount, Scenario, ScenarioInfo, StrategyBase
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.training import FitSettings, fit


class Windows(Dataset):
    """``(x, y, t)``: ``x`` the ``(L,)`` item history, ``y`` the next item, ``t`` the experience."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, t: int) -> None:
        self.x, self.y, self.t = x, y, t

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], self.t


def _windows(order: torch.Tensor, starts: torch.Tensor, history: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = (starts[:, None] + torch.arange(history + 1)) % len(order)
    seq = order[idx]
    return seq[:, :history], seq[:, history]


@SCENARIOS.register("test_next_item")
def next_item(*, seed: int = 0, n_items: int = 20, n_experiences: int = 2, train_per_exp: int = 200,
              test_per_exp: int = 40, history: int = 3) -> Scenario:
    """Next-item prediction over ``n_items`` items, one item permutation per experience."""
    g = torch.Generator().manual_seed(1234)
    train, test = [], []
    for t in range(n_experiences):
        order = torch.randperm(n_items, generator=g)
        for stream, n in ((train, train_per_exp), (test, test_per_exp)):
            x, y = _windows(order, torch.randint(0, n_items, (n,), generator=g), history)
            stream.append(SimpleNamespace(dataset=Windows(x, y, t), current_experience=t))
    info = ScenarioInfo(name="test_next_item", n_experiences=n_experiences, input_shape=(history,),
                        extra={"n_items": n_items})
    return Scenario(info, train, test, RankingEvaluator(n_items, k=10))


@dataclass
class TransitionConfig:
    epochs: int = 5
    lr: float = 0.5
    batch_size: int = 32


@STRATEGIES.register("test_transitions")
class Transitions(StrategyBase):
    """Scores every item by a learned table ``W[last item]`` (fine-tuned with cross-entropy, no replay)."""

    Config = TransitionConfig
    PRESETS = {"cpu": {}}

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.table = nn.Embedding(info.extra["n_items"], info.extra["n_items"])

    def train(self, experience) -> None:
        data = experience.dataset
        settings = FitSettings(self.config.epochs, self.config.batch_size, self.config.lr, optimizer="sgd")
        fit(self.table, lambda x: self.table(x[:, -1]), self.table.parameters(), data.x, data.y, F.cross_entropy,
            settings, seed=len(data), callbacks=self.callbacks)

    @torch.no_grad()
    def predict(self, x, task_labels):
        return self.table(x[:, -1])

    def num_parameters(self) -> ParamCount:
        return ParamCount.of(self.table)
