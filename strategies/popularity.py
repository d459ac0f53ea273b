"""Popularity floors of next-item recommendation: no model, every user gets the same ranking of items by a count
over the training interactions, ties broken towards the lower item id. Their ``V`` counts are all they fit (reported
as their parameters); they are what a trained recommender has to beat.

- ``most_popular``: each item's number of training interactions so far (every experience seen), i.e. of the
  scenario's split: with leave-last-out, every interaction of a user before the held-out item, the user's first
  item included (``experience.interactions``, :func:`clbench.scenarios.movielens.training_interactions`).
- ``recent_popular``: each item's number of users among whose ``n_recent`` most recent training interactions it is
  (over every experience seen): the popularity of what users are consuming now, a stronger floor where the next item
  follows recent trends (Amazon Games).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from clbench.protocol import NEXT_ITEM, ParamCount, ScenarioInfo, StrategyBase
from clbench.registry import STRATEGIES
from clbench.typecheck import RangeChecked


@dataclass
class MostPopularConfig(RangeChecked):
    """No hyperparameters: the counts are the training data's."""


@dataclass
class RecentPopularConfig(RangeChecked):
    """``n_recent``: how many of each user's latest training interactions count. Default 1 (the latest item only),
    chosen on Amazon Games' validation holdout (``holdout: valid``: the second-to-last item held out, the items
    before it counted), NDCG@10 for ``n_recent`` 1 / 2 / 3 / 5 / 10: 0.0132 / 0.0133 / 0.0122 / 0.0121 / 0.0108
    (most_popular 0.0098): the smallest value within one standard error of the best (2 − 1: +0.00006, standard
    error of the per-user paired difference 0.00019)."""

    n_recent: int = 1


class ItemCounts(nn.Module):
    """``counts (V + 1,)`` buffer (index = item id, 0 = padding); ``forward(n)`` -> ``(n, V)`` scores: each item's
    count minus ``id / (V + 1)`` (in ``(0, 1)``, so equal counts rank the lower id first)."""

    def __init__(self, n_items: int) -> None:
        super().__init__()
        self.register_buffer("counts", torch.zeros(n_items + 1, dtype=torch.float64))

    def forward(self, n: int) -> Tensor:
        ids = torch.arange(1, len(self.counts), dtype=torch.float64, device=self.counts.device)
        return (self.counts[1:] - ids / len(self.counts)).expand(n, -1)


class PopularityFloor(StrategyBase):
    """The shared part: the scenario check, the item counts and the ranking. Scores ``(B, V)``: item ``c + 1``'s
    count, the same for every history."""

    scenario_kinds = (NEXT_ITEM,)          # item sequences; info.extra["n_items"] sizes the counts

    def __init__(self, info: ScenarioInfo, device: torch.device, config) -> None:
        super().__init__(info, device, config)
        if "n_items" not in info.extra or not info.extra.get("training_interactions"):
            raise ValueError(f"{type(self).__name__} needs a next-item scenario whose training experiences carry "
                             f"their interactions (info.extra 'n_items' and 'training_interactions', as "
                             f"movielens_seqrec and games_seqrec give); {info.name} has none.")
        self.popularity = ItemCounts(info.extra["n_items"]).to(self.device)

    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        return self.popularity(len(x))

    def num_parameters(self) -> ParamCount:
        """The ``V`` counts, the only numbers it fits to the data."""
        n = len(self.popularity.counts) - 1
        return ParamCount(n, n)


@STRATEGIES.register("most_popular")
class MostPopular(PopularityFloor):
    """``counts[i]`` = number of training interactions with item ``i`` in every experience seen."""

    Config = MostPopularConfig
    PRESETS = {"cpu": {}, "full": {}}

    def train(self, experience) -> None:
        items = experience.interactions[:, 1].to(self.device)
        self.popularity.counts += torch.bincount(items, minlength=len(self.popularity.counts)).double()


@STRATEGIES.register("recent_popular")
class RecentPopular(PopularityFloor):
    """``counts[i]`` = number of users whose ``n_recent`` latest training interactions include item ``i``.

    Over every experience seen: a user's latest items in a later period replace earlier ones."""

    Config = RecentPopularConfig
    PRESETS = {"cpu": {}, "full": {}}

    def __init__(self, info: ScenarioInfo, device: torch.device, config: RecentPopularConfig) -> None:
        super().__init__(info, device, config)
        self.recent = np.zeros((0, 2), dtype=np.int64)           # (user, item) rows, each user's in time order

    def train(self, experience) -> None:
        self.recent = latest_per_user(np.concatenate([self.recent, experience.interactions.numpy()]),
                                      self.config.n_recent)
        counts = np.bincount(self.recent[:, 1], minlength=len(self.popularity.counts))
        self.popularity.counts.copy_(torch.from_numpy(counts))


def latest_per_user(rows: np.ndarray, n: int) -> np.ndarray:
    """The last ``n`` rows of each user of ``(user, item)`` rows in time order (``(M, 2)``, the order kept)."""
    order = np.lexsort((np.arange(len(rows)), rows[:, 0]))         # by user, time order within a user
    users = rows[order, 0]
    # rank from each user's end: position of the user's block end minus own position
    block_end = np.searchsorted(users, users, side="right")
    keep = order[block_end - np.arange(len(rows)) <= n]
    return rows[np.sort(keep)]
