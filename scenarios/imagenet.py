"""Class-incremental ImageNet subsets from an ImageNet-style image folder.

``split_imagenet_subset`` reads ``<root>/train/<wnid>/*.JPEG`` and ``<root>/val/<wnid>/*.JPEG`` (``root`` is a folder
under a data root, e.g. ``imagenet100`` or the default ``tiny-imagenet-100``, or an absolute path) into memory once,
optionally resized to ``image_size`` (otherwise all images must share a size, e.g. Tiny-ImageNet's 64 px; images of
mixed sizes are refused naming ``image_size``). ImageNet's official flat ``val/`` (the JPEGs directly in it) is
labelled from ``LOC_val_solution.csv`` beside it (or Tiny-ImageNet's ``val_annotations.txt``); a flat ``val/``
without one is refused with the fix (:func:`clbench.data.readers.read_flat_image_folder`).
``class_list`` selects classes: a file with one wnid per line (e.g. ``classes.tsv``) or a DER/PODNet ImageNet-100
split file (``train/<wnid>/<file>.JPEG <label>`` lines); relative paths are looked up in ``root``. Original label ``i``
is the ``i``-th selected wnid in sorted order, so ``class_order=1`` (DyTox's ImageNet-100 order, 100 classes only)
indexes the sorted ImageNet-100 wnids as in DyTox; ``"fixed"`` and ``"random"`` work for any number of classes.

Steps, ``initial_classes``, ``classes`` and ``max_per_class`` work as in ``split_cifar100``. Inputs are normalized with
ImageNet's statistics; train augmentation: random crop with ``size // 8`` padding and horizontal flip, declared as
the batch augmentation ``info.batch_augment`` (applied to each training minibatch by the training loop). Memory: a
full ImageNet-100 (about 130,000 images) at 224 px takes about 20 GB as uint8 — use ``image_size`` (e.g. 64)
or ``max_per_class`` on small machines. ``holdout: valid`` scores ``valid_fraction`` of each class's training images
instead of the ``val`` folder (:class:`clbench.streams.Holdout`; the class counts are known only once the folder is
read, so a fraction leaving a class without a training or a validation image is refused when the scenario is built).
"""

from __future__ import annotations

import os

from clbench import data
from clbench.data.orders import IMAGENET100_ORDER1, resolve_class_order
from clbench.data.tensors import crop_flip, image_class_incremental
from clbench.protocol import ClassificationInfo, Scenario
from clbench.registry import SCENARIOS
from clbench.streams import Holdout, HoldoutName, ValidFraction, increments_for

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@SCENARIOS.register("split_imagenet_subset")
def split_imagenet_subset(*, seed: int = 0, root: str = "tiny-imagenet-100", class_list: str | None = None,
                          image_size: int | None = None, n_experiences: int = 10, initial_classes: int = 0,
                          class_order: int | str = "fixed", classes: int | None = None,
                          max_per_class: int | None = None, default_model: str = "resnet18",
                          data_root: str | os.PathLike | None = None, holdout: HoldoutName = "test",
                          valid_fraction: ValidFraction = 0.1) -> Scenario:
    """An ImageNet subset in ``n_experiences`` class-incremental steps (see the module docstring)."""
    arrays = data.load(data.image_folder_dataset(root, class_list, image_size), data_root)
    order = resolve_class_order(class_order, len(arrays.class_names), seed, {1: IMAGENET100_ORDER1})[:classes]
    size = arrays.x_train.shape[1]
    info = ClassificationInfo(name="split_imagenet_subset", n_classes=len(order),
                              classes_per_experience=tuple(increments_for(len(order), n_experiences, initial_classes)),
                              input_shape=(3, size, size), mean=IMAGENET_MEAN, std=IMAGENET_STD,
                              default_model=default_model,
                              extra={"root": root, "wnids": arrays.class_names, "class_order_name": class_order})
    return image_class_incremental(info, arrays, order, max_per_class, batch_augment=crop_flip(size, size // 8),
                                   holdout=Holdout(holdout, valid_fraction))


split_imagenet_subset.data_check = "clbench.data.catalog:check_image_folder"   # torch-free: run before the imports
