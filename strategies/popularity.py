"""``most_popular``: the popularity floor of next-item recommendation. Every user gets the same ranking: items by
the number of times they are a training target so far (the targets ``y > 0`` of every training experience seen,
i.e. the interactions a trained model learns from), ties broken towards the lower item id. No model: its
``V`` counts are all it fits (reported as its parameters); it is what a trained recommender has to beat.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from clbench.protocol import ParamCount, ScenarioInfo, StrategyBase
from clbench.registry import STRATEGIES
from clbench.typecheck import RangeChecked


@dataclass
class MostPopularConfig(RangeChecked):
    """No hyperparameters: the counts are the training data's."""


class ItemCounts(nn.Module):
    """``counts (V + 1,)`` buffer (index = item id, 0 = padding); ``forward(n)`` -> ``(n, V)`` scores: each item's
    count minus ``id / (V + 1)`` (in ``(0, 1)``, so equal counts rank the lower id first)."""

    def __init__(self, n_items: int) -> None:
        super().__init__()
        self.register_buffer("counts", torch.zeros(n_items + 1, dtype=torch.float64))

    def forward(self, n: int) -> Tensor:
        ids = torch.arange(1, len(self.counts), dtype=torch.float64, device=self.counts.device)
        return (self.counts[1:] - ids / len(self.counts)).expand(n, -1)


@STRATEGIES.register("most_popular")
class MostPopular(StrategyBase):
    """Scores ``(B, V)``: item ``c + 1``'s count of training targets, the same for every history."""

    Config = MostPopularConfig
    PRESETS = {"cpu": {}, "full": {}}

    def __init__(self, info: ScenarioInfo, device: torch.device, config: MostPopularConfig) -> None:
        super().__init__(info, device, config)
        if "n_items" not in info.extra:
            raise ValueError(f"most_popular needs a next-item scenario (info.extra['n_items']); {info.name} has none.")
        self.popularity = ItemCounts(info.extra["n_items"]).to(self.device)

    def train(self, experience) -> None:
        y = experience.dataset.y.to(self.device)
        counts = self.popularity.counts
        counts += torch.bincount(y[y > 0], minlength=len(counts)).double()

    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        return self.popularity(len(x))

    def num_parameters(self) -> ParamCount:
        """The ``V`` counts, the only numbers it fits to the data."""
        n = len(self.popularity.counts) - 1
        return ParamCount(n, n)
