"""A CIFAR-100 subset that can travel to a lent GPU machine, and the scenario that reads it (a plugin file).

The device tool sends at most 64 MiB with each call; ``cifar100.npz`` is 160 MB. ``benchmarks/gpu_check.sh`` therefore
runs ``cifar100_full``'s strategies on the first ``--train``/``--test`` images of each class of the same file (real
pixels, deterministic: :func:`clbench.data.tensors.per_class_subset`), written here by::

    CLBENCH_DATA=../shared/data python benchmarks/gpu_check_cifar.py .gpudata/cifar100_subset.npz

and read on the device by the scenario ``split_cifar100_subset`` (``--plugins benchmarks/gpu_check_cifar.py``),
which is ``split_cifar100`` (same class orders, normalization, augmentation and step sizes) over that file. Accuracies
on it are not comparable with the full data's; throughput (images per second) is.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import numpy as np

from clbench import data
from clbench.data.catalog import SplitArrays
from clbench.data.orders import CIFAR100_ORDERS, resolve_class_order
from clbench.data.tensors import crop_flip, image_class_incremental, per_class_subset
from clbench.protocol import ClassificationInfo, Scenario
from clbench.registry import SCENARIOS
from clbench.scenarios.cifar import CIFAR100_MEAN, CIFAR100_STD
from clbench.streams import increments_for


@SCENARIOS.register("split_cifar100_subset")
def split_cifar100_subset(*, path: str, seed: int = 0, n_experiences: int = 10, initial_classes: int = 0,
                          class_order: int | str = 1, classes: int | None = None,
                          default_model: str = "resnet32") -> Scenario:
    """``split_cifar100`` over the subset file ``path`` (written by :func:`write_subset`)."""
    with np.load(Path(os.path.expandvars(path))) as z:
        arrays = SplitArrays(z["x_train"], z["y_train"].astype(np.int64), z["x_test"], z["y_test"].astype(np.int64))
    order = resolve_class_order(class_order, 100, seed, CIFAR100_ORDERS)[:classes]
    info = ClassificationInfo(name="split_cifar100_subset", n_classes=len(order),
                              classes_per_experience=tuple(increments_for(len(order), n_experiences, initial_classes)),
                              input_shape=(3, 32, 32), mean=CIFAR100_MEAN, std=CIFAR100_STD,
                              default_model=default_model, extra={"class_order_name": class_order})
    return image_class_incremental(info, arrays, order, batch_augment=crop_flip(32, padding=4))


def write_subset(out: Path, train_per_class: int, test_per_class: int) -> SplitArrays:
    """The first ``train_per_class`` / ``test_per_class`` images of every class of the local CIFAR-100, saved to
    ``out`` (npz: ``x_train (N, 32, 32, 3)`` uint8, ``y_train``, ``x_test``, ``y_test``)."""
    full = data.load(data.CIFAR100)
    train = per_class_subset(full.y_train, None, train_per_class)
    test = per_class_subset(full.y_test, None, test_per_class)
    subset = SplitArrays(full.x_train[train], full.y_train[train], full.x_test[test], full.y_test[test])
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **{f.name: getattr(subset, f.name) for f in dataclasses.fields(subset) if f.name != "class_names"})
    return subset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=100, help="training images per class (default 100)")
    parser.add_argument("--test", type=int, default=20, help="test images per class (default 20)")
    args = parser.parse_args()
    subset = write_subset(args.out, args.train, args.test)
    print(f"{args.out}: {len(subset.y_train)} training / {len(subset.y_test)} test images, "
          f"{args.out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
