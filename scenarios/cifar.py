"""Split CIFAR-100 (32 x 32 RGB, 100 classes, 500 train / 100 test images per class).

``split_cifar100`` follows DER/DyTox: ``initial_classes=0`` (B0: all steps equal) or ``50`` (B50: 50 classes first,
the remaining 50 split evenly), class order 1, 2 or 3 of DER/DyTox (:data:`clbench.data.orders.CIFAR100_ORDERS`),
``"random"`` (drawn from ``seed``) or ``"fixed"`` (0..99). ``n_experiences`` counts every experience, the B50 base
step included: the papers' "B50, 10 steps" (50 + 10 x 5 classes) is ``initial_classes=50, n_experiences=11``;
"10 steps" B0 is ``n_experiences=10``.

``cifar100_transfer`` is He et al.'s single-task transfer protocol at CPU scale: classes 0 .. ``classes``-1 (at most
50) of the fixed order as ONE experience, for a backbone pre-trained on the disjoint classes 50-99.

Small versions (tests, CPU presets): ``classes=k`` keeps the first ``k`` classes of the class order, ``max_per_class``
the first images of each class. Train augmentation: random crop with 4-pixel padding and horizontal flip, declared
as the batch augmentation ``info.batch_augment`` (applied to each training minibatch by the training loop,
:mod:`clbench.callbacks`; the datasets have no per-sample train transform).
``holdout: valid`` scores ``valid_fraction`` of each class's training images (after ``max_per_class``) instead of the
test set (:class:`clbench.streams.Holdout`).
Data: the official python pickles (``cifar-100-python/``) or ``cifar100/cifar100.npz`` under a data root.
"""

from __future__ import annotations

import os

from clbench import data
from clbench.data.orders import CIFAR100_ORDERS, resolve_class_order
from clbench.data.tensors import crop_flip, image_class_incremental
from clbench.protocol import ClassificationInfo, Scenario
from clbench.registry import SCENARIOS
from clbench.streams import Holdout, HoldoutName, ValidFraction, check_capped_holdout, increments_for

# training-set statistics of the official split (the stratified re-split in cifar100.npz differs by < 0.001)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
CIFAR100_TRAIN_PER_CLASS = 500


@SCENARIOS.register("split_cifar100")
def split_cifar100(*, seed: int = 0, n_experiences: int = 10, initial_classes: int = 0, class_order: int | str = 1,
                   classes: int | None = None, max_per_class: int | None = None, default_model: str = "resnet32",
                   data_root: str | os.PathLike | None = None, holdout: HoldoutName = "test",
                   valid_fraction: ValidFraction = 0.1) -> Scenario:
    """CIFAR-100 in ``n_experiences`` class-incremental steps (see the module docstring for the arguments)."""
    order = resolve_class_order(class_order, 100, seed, CIFAR100_ORDERS)[:classes]
    info = ClassificationInfo(name="split_cifar100", n_classes=len(order),
                              classes_per_experience=tuple(increments_for(len(order), n_experiences, initial_classes)),
                              input_shape=(3, 32, 32), mean=CIFAR100_MEAN, std=CIFAR100_STD,
                              default_model=default_model, extra={"class_order_name": class_order})
    return image_class_incremental(info, data.load(data.CIFAR100, data_root), order, max_per_class,
                                   batch_augment=crop_flip(32, padding=4), holdout=Holdout(holdout, valid_fraction))


def _holdout_check(default_classes: int):
    """``check_args`` of a CIFAR-100 scenario keeping ``classes`` classes (``default_classes`` when not given) of 500
    training images each: its validation holdout (:func:`clbench.streams.check_capped_holdout`)."""
    def check_args(*, classes: int | None = None, **args: object) -> None:
        kept = default_classes if classes is None else classes
        check_capped_holdout((CIFAR100_TRAIN_PER_CLASS,) * kept, args)
    return check_args


split_cifar100.check_args = _holdout_check(100)
split_cifar100.input_shape = lambda **_: (3, 32, 32)  # (C, H, W), recorded: checked at load
split_cifar100.datasets = (data.CIFAR100,)     # what it reads (recorded in the index, checked before imports)


@SCENARIOS.register("cifar100_transfer")
def cifar100_transfer(*, seed: int = 0, classes: int = 50, max_per_class: int | None = None,
                      default_model: str = "vit", data_root: str | os.PathLike | None = None,
                      holdout: HoldoutName = "test", valid_fraction: ValidFraction = 0.1) -> Scenario:
    """CIFAR-100 classes ``0 .. classes-1`` in one experience (transfer to one task; classes 50-99 are the
    pre-training source, so ``classes`` <= 50). ``seed`` changes training only, not the data."""
    if not 1 <= classes <= 50:
        raise ValueError(f"cifar100_transfer: classes must be in 1..50 (classes 50-99 are the pre-training source), "
                         f"got {classes}.")
    order = list(range(classes))
    info = ClassificationInfo(name="cifar100_transfer", n_classes=classes, classes_per_experience=(classes,),
                              input_shape=(3, 32, 32), mean=CIFAR100_MEAN, std=CIFAR100_STD,
                              default_model=default_model, extra={"class_order_name": "fixed"})
    return image_class_incremental(info, data.load(data.CIFAR100, data_root), order, max_per_class,
                                   batch_augment=crop_flip(32, padding=4), holdout=Holdout(holdout, valid_fraction))


cifar100_transfer.check_args = _holdout_check(50)
cifar100_transfer.input_shape = split_cifar100.input_shape
cifar100_transfer.datasets = (data.CIFAR100,)     # what it reads (recorded in the index, checked before imports)
