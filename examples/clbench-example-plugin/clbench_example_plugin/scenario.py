"""``rings``: points on concentric 2-D rings, one ring per class, learnt a few rings at a time.

Class ``c`` (of ``n_classes``) draws angles ``θ ~ U(0, 2π)`` and radius ``r = 1 + c + N(0, noise²)``; a sample is
``(r cos θ, r sin θ)``. The data depend on ``seed`` only through the class order when ``shuffle_classes``.
"""

from __future__ import annotations

import math

import torch

from clbench.protocol import ClassificationInfo, Scenario
from clbench.registry import SCENARIOS
from clbench.streams import class_incremental, increments_for, seeded_class_order


@SCENARIOS.register("rings")
def rings(*, seed: int = 0, n_classes: int = 6, n_experiences: int = 3, train_per_class: int = 100,
          test_per_class: int = 50, noise: float = 0.15, shuffle_classes: bool = False) -> Scenario:
    """Concentric rings, one per class, in ``n_experiences`` class-incremental steps (example plugin)."""
    g = torch.Generator().manual_seed(4321)

    def draw(per_class: int):
        y = torch.arange(n_classes).repeat_interleave(per_class)
        theta = 2 * math.pi * torch.rand(len(y), generator=g)
        radius = 1 + y + noise * torch.randn(len(y), generator=g)
        return torch.stack([radius * theta.cos(), radius * theta.sin()], dim=1), y

    x_train, y_train = draw(train_per_class)
    x_test, y_test = draw(test_per_class)
    order = seeded_class_order(n_classes, seed) if shuffle_classes else list(range(n_classes))
    info = ClassificationInfo(name="rings", n_classes=n_classes,
                              classes_per_experience=tuple(increments_for(n_classes, n_experiences)),
                              input_shape=(2,), mean=(0.0,), std=(1.0,), default_model="mlp")
    return class_incremental(info, x_train, y_train, x_test, y_test, order)
