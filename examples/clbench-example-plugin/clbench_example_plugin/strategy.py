"""``nearest_mean``: a small MLP trained on each experience, predicting by the nearest class mean of its features.

For experience ``t`` the network ``f`` (input -> features of size ``hidden``) and a linear head are trained with
cross-entropy through :func:`clbench.training.fit` (so every callback sees the batches); then each new class ``c``
gets its mean feature ``mu_c = mean_{i: y_i = c} f(x_i)``, computed once with the network of that time. A sample is
scored ``-||f(x) - mu_c||^2`` for every class seen (Rebuffi et al.'s nearest-mean-of-exemplars rule, without a
memory: old means are not refreshed, so feature drift shows as forgetting).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from clbench.cl.data import experience_tensors
from clbench.protocol import CLASSIFICATION, ParamCount, StrategyBase
from clbench.registry import STRATEGIES
from clbench.training import OPTIMIZERS, FitSettings, fit
from clbench.typecheck import AT_LEAST_1, RangeChecked, setting


@dataclass
class NearestMeanConfig(RangeChecked):
    """What each field may be is declared beside it (:func:`clbench.typecheck.setting`); ``epochs``,
    ``batch_size`` and ``lr`` are generic names with a central rule (``>= 1``, ``>= 1``, ``> 0``). Checked at load
    for a suite file and at construction in Python."""

    hidden: int = setting(64, within=AT_LEAST_1)                # width of the features f(x)
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-3
    optimizer: str = setting("adam", choices=OPTIMIZERS.names)   # one of clbench.training.OPTIMIZERS


@STRATEGIES.register("nearest_mean")
class NearestMean(StrategyBase):
    """MLP features + nearest class mean, the means fixed when their classes are learnt (example plugin)."""

    Config = NearestMeanConfig
    PRESETS = {"cpu": {"epochs": 2}, "full": {}}
    scenario_kinds = (CLASSIFICATION,)          # what it serves (the default, written out): labelled samples

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), config.hidden),
                                      nn.ReLU()).to(self.device)
        self.head = nn.Linear(config.hidden, info.n_classes).to(self.device)
        self.means = torch.zeros(info.n_classes, config.hidden, device=self.device)
        self.seen = torch.zeros(info.n_classes, dtype=torch.bool, device=self.device)

    def train(self, experience):
        x, y = (t.to(self.device) for t in experience_tensors(experience))
        model = nn.Sequential(self.features, self.head)
        settings = FitSettings(self.config.epochs, self.config.batch_size, self.config.lr,
                               optimizer=self.config.optimizer)
        fit(model, model, model.parameters(), x, y, F.cross_entropy, settings,
            seed=experience.current_experience, callbacks=self.callbacks)
        with torch.no_grad():
            z = self.features(x)
            for c in y.unique():
                self.means[c] = z[y == c].mean(0)
                self.seen[c] = True

    @torch.no_grad()
    def predict(self, x, task_labels):
        scores = -torch.cdist(self.features(x.to(self.device)), self.means) ** 2
        return scores.masked_fill(~self.seen, -math.inf)

    def num_parameters(self):
        return ParamCount.of(self.features, self.head)
