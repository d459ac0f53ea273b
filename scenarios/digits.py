"""Split digits: scikit-learn's bundled 8x8 handwritten digits (1,797 images), the embedded default scenario."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

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
from clbench.typecheck import Range

DIGITS_MEAN, DIGITS_STD = 4.8842 / 16, 6.0168 / 16   # pixel statistics of the 1,797 images, scaled to [0, 1]


@SCENARIOS.register("split_digits")
def split_digits(*, seed: int = 0, n_experiences: int = 5, class_order: str = "fixed",
                 test_fraction: Annotated[float, Range(0, 1, open_low=True, open_high=True)] = 0.3,
                 task_aware: bool = False, holdout: HoldoutName = "test", valid_fraction: ValidFraction = 0.1
                 ) -> Scenario:
    """Digits 0-9 in ``n_experiences`` class-incremental steps (5 x 2 classes by default).

    The train/test split is fixed (stratified, ``random_state=0``) so that every seed sees the same test set;
    ``class_order="fixed"`` keeps 0..9, ``"random"`` draws the order from ``seed``. Images are (1, 8, 8),
    scaled to [0, 1] and normalized with the mean/std above. ``holdout: valid`` scores ``valid_fraction`` of the
    training images instead of the test set (:class:`clbench.streams.Holdout`).
    """
    digits = load_digits()
    x = digits.images.astype(np.float32)[:, None] / 16.0
    x = (x - DIGITS_MEAN) / DIGITS_STD
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=test_fraction, random_state=0,
                                              stratify=digits.target)
    orders = {"fixed": lambda: list(range(10)), "random": lambda: seeded_class_order(10, seed)}
    if class_order not in orders:
        raise ValueError(f"split_digits: class_order must be one of {sorted(orders)}, got {class_order!r}.")
    info = ClassificationInfo(name="split_digits", n_classes=10,
                              classes_per_experience=tuple(increments_for(10, n_experiences)),
                              input_shape=(1, 8, 8), mean=(DIGITS_MEAN,), std=(DIGITS_STD,), task_aware=task_aware,
                              default_model="mlp")
    return class_incremental(info, torch.from_numpy(x_tr), torch.from_numpy(y_tr), torch.from_numpy(x_te),
                             torch.from_numpy(y_te), orders[class_order](), holdout=Holdout(holdout, valid_fraction))


def _train_counts(test_fraction: float) -> list[int]:
    """Training images per digit after the fixed train/test split (before any validation holdout)."""
    target = load_digits().target
    train = train_test_split(target, test_size=test_fraction, random_state=0, stratify=target)[0]
    return np.bincount(train, minlength=10).tolist()


def _check_args(*, n_experiences: int = 5, test_fraction: float = 0.3, **args: object) -> None:
    """What ``split_digits`` refuses when built and can be known from its arguments (the 10 classes cannot be split
    into ``n_experiences`` steps; the validation holdout, :func:`clbench.streams.check_holdout`): checked when a
    suite loads (:func:`clbench.suite_file.parse_suite`)."""
    increments_for(10, n_experiences)
    check_holdout(dict(enumerate(_train_counts(test_fraction))), args)


def _sizes(*, n_experiences: int = 5, class_order: str = "fixed", test_fraction: float = 0.3,
           holdout: HoldoutName = "test", valid_fraction: float = 0.1, **_: object) -> dict[str, int]:
    """The training samples of the whole stream and of its smallest experience (for every class order when
    ``class_order`` is random; after the validation holdout), from the labels alone: what a suite's ``mem_size`` and
    ``n_shards`` are checked against when it loads (:data:`clbench.typecheck.SCENARIO_SIZES`)."""
    counts = Holdout(holdout, valid_fraction).train_counts(_train_counts(test_fraction))
    return stream_sizes(counts, n_experiences, class_order == "fixed")


def stream_sizes(counts, n_experiences: int, fixed_order: bool) -> dict[str, int]:
    """``{train_samples, experience_samples}`` of a class-incremental stream over classes with ``counts`` training
    samples each, in ``n_experiences`` steps: the smallest experience of the order 0, 1, ... (``fixed_order``), else
    the smallest any class order can make (its fewest classes with the fewest samples)."""
    counts = np.asarray(counts)
    steps = increments_for(len(counts), n_experiences)
    if fixed_order:
        smallest = min(int(c.sum()) for c in np.split(counts, np.cumsum(steps)[:-1]))
    else:
        smallest = int(np.sort(counts)[:min(steps)].sum())
    return {"train_samples": int(counts.sum()), "experience_samples": smallest}


split_digits.check_args = _check_args
split_digits.sizes = _sizes
split_digits.size_limits = {"train_samples": 1787}   # any arguments: the stratified split tests 10 images at least
split_digits.input_shape = lambda **_: (1, 8, 8)  # (C, H, W), recorded: checked at load
