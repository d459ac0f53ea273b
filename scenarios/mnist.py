"""MNIST and Fashion-MNIST scenarios (28 x 28 grey images, 60,000 train / 10,000 test each).

- ``split_mnist`` / ``split_fmnist``: the 10 classes in ``n_experiences`` class-incremental steps (5 x 2 default).
- ``mnist_transfer``: the 10 digits as ONE experience (single-task transfer, He et al.'s protocol, for a backbone
  pre-trained on Fashion-MNIST).
- ``mnist_fmnist``: MNIST, then Fashion-MNIST, as two experiences. ``mode="class"``: labels 0-9 are MNIST's digits
  and 10-19 Fashion-MNIST's classes; ``mode="domain"``: both use the shared labels 0-9
  (``ClassificationInfo.domain_incremental``). Both datasets are normalized with the statistics of their joint training
  set, so one ``info.mean``/``info.std`` describes the inputs.

Data come from :mod:`clbench.data` (``mnist/`` or ``MNIST/raw/``, ``fashion-mnist/`` or ``FashionMNIST/raw/``
under a data root). ``max_per_class`` keeps the first ``k`` images of each class of each split (quick runs, tests).
``holdout: valid`` scores ``valid_fraction`` of each class's training images instead of the test set
(:class:`clbench.streams.Holdout`; after ``max_per_class``).
"""

from __future__ import annotations

import os
from typing import Literal

from clbench import data
from clbench.data.orders import resolve_class_order
from clbench.data.tensors import image_class_incremental, prepared_tensors
from clbench.protocol import ClassificationInfo, Scenario
from clbench.registry import SCENARIOS
from clbench.scenarios.digits import stream_sizes
from clbench.streams import (
    Holdout,
    HoldoutName,
    ValidFraction,
    capped_counts,
    check_capped_holdout,
    experience_dataset,
    increments_for,
    wrap_benchmark,
)

# training-set pixel statistics in [0, 1] (computed from the official files: clbench.data.tensors.channel_stats)
MNIST_STATS = ((0.1307,), (0.3081,))
FASHION_MNIST_STATS = ((0.2860,), (0.3530,))
JOINT_STATS = ((0.2084,), (0.3403,))


def _split(name: str, spec: data.DatasetSpec, stats: tuple, *, seed: int, n_experiences: int, class_order: str,
           max_per_class: int | None, task_aware: bool, data_root: str | os.PathLike | None,
           holdout: Holdout) -> Scenario:
    order = resolve_class_order(class_order, 10, seed)
    info = ClassificationInfo(name=name, n_classes=10, classes_per_experience=tuple(increments_for(10, n_experiences)),
                              input_shape=(1, 28, 28), mean=stats[0], std=stats[1], task_aware=task_aware,
                              default_model="mlp")
    return image_class_incremental(info, data.load(spec, data_root), order, max_per_class, holdout=holdout)


@SCENARIOS.register("split_mnist")
def split_mnist(*, seed: int = 0, n_experiences: int = 5, class_order: str = "fixed", max_per_class: int | None = None,
                task_aware: bool = False, data_root: str | os.PathLike | None = None, holdout: HoldoutName = "test",
                valid_fraction: ValidFraction = 0.1) -> Scenario:
    """MNIST digits in ``n_experiences`` steps; ``class_order`` ``"fixed"`` (0..9) or ``"random"`` (from ``seed``)."""
    return _split("split_mnist", data.MNIST, MNIST_STATS, seed=seed, n_experiences=n_experiences,
                  class_order=class_order, max_per_class=max_per_class, task_aware=task_aware, data_root=data_root,
                  holdout=Holdout(holdout, valid_fraction))


@SCENARIOS.register("split_fmnist")
def split_fmnist(*, seed: int = 0, n_experiences: int = 5, class_order: str = "fixed",
                 max_per_class: int | None = None, task_aware: bool = False,
                 data_root: str | os.PathLike | None = None, holdout: HoldoutName = "test",
                 valid_fraction: ValidFraction = 0.1) -> Scenario:
    """Fashion-MNIST classes in ``n_experiences`` steps; ``class_order`` as for ``split_mnist``."""
    return _split("split_fmnist", data.FASHION_MNIST, FASHION_MNIST_STATS, seed=seed, n_experiences=n_experiences,
                  class_order=class_order, max_per_class=max_per_class, task_aware=task_aware, data_root=data_root,
                  holdout=Holdout(holdout, valid_fraction))


MNIST_TRAIN_PER_CLASS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)   # the official 60,000
FASHION_MNIST_TRAIN_PER_CLASS = (6000,) * 10


def _holdout_check(*datasets: tuple[int, ...]):
    """``check_args`` of a scenario over the classes of ``datasets`` (official training counts, labels numbered on
    from one dataset to the next): its validation holdout (:func:`clbench.streams.check_capped_holdout`)."""
    def check_args(**args: object) -> None:
        check_capped_holdout([n for per_class in datasets for n in per_class], args)
    return check_args


def _split_check(per_class: tuple[int, ...]):
    holdout_check = _holdout_check(per_class)

    def check_args(*, n_experiences: int = 5, **args: object) -> None:
        """The 10 classes split into ``n_experiences`` steps and the validation holdout, checked when a suite
        loads."""
        increments_for(10, n_experiences)
        holdout_check(**args)
    return check_args


def _sizes_of(per_class: tuple[int, ...]):
    def sizes(*, n_experiences: int = 5, class_order: str = "fixed", max_per_class: int | None = None,
              holdout: HoldoutName = "test", valid_fraction: float = 0.1, **_: object) -> dict[str, int]:
        """Training samples of the stream and of its smallest experience, from the official class counts (after
        ``max_per_class`` and the validation holdout)."""
        counts = Holdout(holdout, valid_fraction).train_counts(capped_counts(per_class, max_per_class))
        return stream_sizes(counts, n_experiences, class_order == "fixed")
    return sizes


split_mnist.check_args = _split_check(MNIST_TRAIN_PER_CLASS)
split_fmnist.check_args = _split_check(FASHION_MNIST_TRAIN_PER_CLASS)
split_mnist.sizes = _sizes_of(MNIST_TRAIN_PER_CLASS)
split_mnist.size_limits = {"train_samples": sum(MNIST_TRAIN_PER_CLASS)}    # any arguments
split_mnist.input_shape = lambda **_: (1, 28, 28)  # (C, H, W), recorded: checked at load
split_fmnist.sizes = _sizes_of(FASHION_MNIST_TRAIN_PER_CLASS)
split_fmnist.size_limits = {"train_samples": sum(FASHION_MNIST_TRAIN_PER_CLASS)}
split_fmnist.input_shape = split_mnist.input_shape
split_mnist.datasets = (data.MNIST,)        # what it reads: checked before `clbench run` imports (the index records it)
split_fmnist.datasets = (data.FASHION_MNIST,)


@SCENARIOS.register("mnist_transfer")
def mnist_transfer(*, seed: int = 0, max_per_class: int | None = None,
                   data_root: str | os.PathLike | None = None, holdout: HoldoutName = "test",
                   valid_fraction: ValidFraction = 0.1) -> Scenario:
    """MNIST's 10 digits in one experience (``seed`` changes training only, not the data)."""
    return _split("mnist_transfer", data.MNIST, MNIST_STATS, seed=seed, n_experiences=1, class_order="fixed",
                  max_per_class=max_per_class, task_aware=False, data_root=data_root,
                  holdout=Holdout(holdout, valid_fraction))


mnist_transfer.check_args = _holdout_check(MNIST_TRAIN_PER_CLASS)
mnist_transfer.datasets = (data.MNIST,)
mnist_transfer.input_shape = split_mnist.input_shape


@SCENARIOS.register("mnist_fmnist")
def mnist_fmnist(*, seed: int = 0, mode: Literal["class", "domain"] = "class", max_per_class: int | None = None,
                 task_aware: bool = False, data_root: str | os.PathLike | None = None, holdout: HoldoutName = "test",
                 valid_fraction: ValidFraction = 0.1) -> Scenario:
    """Experience 0 = MNIST, experience 1 = Fashion-MNIST (``seed`` does not change the data or the order); each
    dataset's validation holdout is split from its own training images."""
    if mode not in ("class", "domain"):
        raise ValueError(f"mnist_fmnist: mode must be 'class' or 'domain', got {mode!r}.")
    parts = [prepared_tensors(data.load(spec, data_root), *JOINT_STATS, max_per_class=max_per_class)
             for spec in (data.MNIST, data.FASHION_MNIST)]
    info = ClassificationInfo(name="mnist_fmnist", n_classes=20 if mode == "class" else 10,
                              classes_per_experience=(10, 10), input_shape=(1, 28, 28), mean=JOINT_STATS[0],
                              std=JOINT_STATS[1], task_aware=task_aware, domain_incremental=mode == "domain",
                              default_model="mlp", class_order=tuple(range(20 if mode == "class" else 10)))
    offset = 10 if mode == "class" else 0
    split = Holdout(holdout, valid_fraction)
    train, test = [], []
    for t, part in enumerate(parts):
        x_tr, y_tr, x_te, y_te = split.select(*part)
        task = t if task_aware else 0
        train.append(experience_dataset(x_tr, y_tr + t * offset, task, None, None, train=True))
        test.append(experience_dataset(x_te, y_te + t * offset, task, None, None, train=False))
    return wrap_benchmark(split.described(info), train, test)


mnist_fmnist.check_args = _holdout_check(MNIST_TRAIN_PER_CLASS, FASHION_MNIST_TRAIN_PER_CLASS)
mnist_fmnist.datasets = (data.MNIST, data.FASHION_MNIST)
mnist_fmnist.input_shape = split_mnist.input_shape
