"""Synthetic Gaussian-cluster scenario: instant to build, for tests and smoke runs."""

from __future__ import annotations

import torch

from clbench.protocol import ClassificationInfo, Scenario
from clbench.registry import SCENARIOS
from clbench.streams import (
    Holdout,
    HoldoutName,
    ValidFraction,
    check_holdout,
    class_incremental,
    increments_for,
    seeded_class_order,
)


@SCENARIOS.register("synthetic")
def synthetic(*, seed: int = 0, n_classes: int = 6, n_experiences: int = 3, train_per_class: int = 40,
              test_per_class: int = 20, image_size: int = 8, channels: int = 1, separation: float = 3.0,
              task_aware: bool = False, shuffle_classes: bool = False, holdout: HoldoutName = "test",
              valid_fraction: ValidFraction = 0.1) -> Scenario:
    """Class ``c`` images are ``mu_c + N(0, 1)`` with a fixed random mean image ``mu_c`` of norm ``separation``
    per pixel scale; the data depend only on ``n_classes``/sizes (generator seed 1234), the class order on ``seed``
    when ``shuffle_classes``. ``holdout: valid`` scores ``valid_fraction`` of the training samples instead of the
    test samples (:class:`clbench.streams.Holdout`)."""
    g = torch.Generator().manual_seed(1234)
    shape = (channels, image_size, image_size)
    means = torch.randn(n_classes, *shape, generator=g)
    means = separation * means / means.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * (means[0].numel() ** 0.5) / 4

    def draw(per_class: int):
        y = torch.arange(n_classes).repeat_interleave(per_class)
        return means[y] + torch.randn(len(y), *shape, generator=g), y

    x_train, y_train = draw(train_per_class)
    x_test, y_test = draw(test_per_class)
    order = seeded_class_order(n_classes, seed) if shuffle_classes else list(range(n_classes))
    info = ClassificationInfo(name="synthetic", n_classes=n_classes,
                              classes_per_experience=tuple(increments_for(n_classes, n_experiences)),
                              input_shape=shape, mean=(0.0,) * channels, std=(1.0,) * channels, task_aware=task_aware,
                              default_model="mlp")
    return class_incremental(info, x_train, y_train, x_test, y_test, order, holdout=Holdout(holdout, valid_fraction))


def _check_args(*, n_classes: int = 6, n_experiences: int = 3, train_per_class: int = 40, **args: object) -> None:
    """The ``n_classes`` classes split into ``n_experiences`` steps and the validation holdout
    (:func:`clbench.streams.check_holdout`), checked when a suite loads."""
    increments_for(n_classes, n_experiences)
    check_holdout(dict.fromkeys(range(n_classes), train_per_class), args)


def _sizes(*, n_classes: int = 6, n_experiences: int = 3, train_per_class: int = 40, holdout: HoldoutName = "test",
           valid_fraction: float = 0.1, **_: object) -> dict[str, int]:
    """Training samples of the stream and of its smallest experience, after the validation holdout
    (:data:`clbench.typecheck.SCENARIO_SIZES`)."""
    per_class = Holdout(holdout, valid_fraction).train_counts([train_per_class])[0]
    return {"train_samples": n_classes * per_class,
            "experience_samples": min(increments_for(n_classes, n_experiences)) * per_class}


synthetic.check_args = _check_args
synthetic.sizes = _sizes


def _input_shape(*, image_size: int = 8, channels: int = 1, **_: object) -> tuple[int, int, int]:
    """The input ``(C, H, W)`` of :func:`synthetic` for its arguments (recorded in the index: model shapes are
    checked at load)."""
    return channels, image_size, image_size


synthetic.input_shape = _input_shape
