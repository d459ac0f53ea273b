"""From uint8 image arrays to the normalized float tensors scenarios hold in memory, and on to a scenario."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from clbench.augment import CropFlip
from clbench.data.catalog import SplitArrays
from clbench.protocol import ClassificationInfo, Scenario
from clbench.streams import TEST_SET, Holdout, Transform, class_incremental


def per_class_subset(y: np.ndarray, classes: Sequence[int] | None = None,
                     max_per_class: int | None = None) -> np.ndarray:
    """Indices (sorted) of the samples whose label is in ``classes`` (all when None), keeping at most the first
    ``max_per_class`` of each class in stored order — deterministic, so every seed sees the same subset."""
    keep = np.isin(y, np.asarray(classes)) if classes is not None else np.ones(len(y), dtype=bool)
    if max_per_class is not None:
        rank = np.zeros(len(y), dtype=np.int64)
        for c in np.unique(y[keep]):
            members = np.flatnonzero(y == c)
            rank[members] = np.arange(len(members))
        keep &= rank < max_per_class
    return np.flatnonzero(keep)


def to_normalized(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(N, H, W, C)`` uint8 -> ``(N, C, H, W)`` float32, ``(x / 255 - mean[c]) / std[c]`` per channel."""
    images = torch.from_numpy(x.astype(np.float32)).permute(0, 3, 1, 2).div_(255)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return images.sub_(mean_t).div_(std_t).contiguous()


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``(N, H, W, C)`` uint8 images scaled to [0, 1] (float64 accumulation)."""
    flat = x.reshape(-1, x.shape[-1])
    mean = flat.mean(axis=0, dtype=np.float64) / 255
    sq = np.square(flat, dtype=np.float64).mean(axis=0) / 255**2
    return tuple(mean.round(4).tolist()), tuple(np.sqrt(sq - mean**2).round(4).tolist())


def prepared_tensors(data: SplitArrays, mean: Sequence[float], std: Sequence[float],
                     classes: Sequence[int] | None = None, max_per_class: int | None = None
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x_train, y_train, x_test, y_test)``: the samples of ``classes`` (all when None), at most ``max_per_class``
    per class in each split, as normalized ``(N, C, H, W)`` float tensors and int64 labels (original numbering)."""
    out: list[Tensor] = []
    for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test)):
        keep = per_class_subset(y, classes, max_per_class)
        out += [to_normalized(x[keep], mean, std), torch.from_numpy(y[keep].astype(np.int64))]
    x_train, y_train, x_test, y_test = out
    return x_train, y_train, x_test, y_test


def image_class_incremental(info: ClassificationInfo, data: SplitArrays, class_order: Sequence[int],
                            max_per_class: int | None = None, train_transform: Transform = None,
                            holdout: Holdout = TEST_SET, batch_augment: CropFlip | None = None) -> Scenario:
    """The shared path from arrays to a class-incremental scenario: keep the classes of ``class_order`` (which may
    be a prefix of a longer order), normalize with ``info.mean``/``info.std`` and split by
    ``info.classes_per_experience`` (:func:`clbench.streams.class_incremental`, which applies ``holdout``; labels are
    renumbered by position in ``class_order``). ``info.input_shape`` is filled in from the data.

    Train augmentation: ``batch_augment`` (the image scenarios' :class:`~clbench.augment.CropFlip`) goes into
    ``info.batch_augment``, applied by the training loops to each minibatch (:mod:`clbench.callbacks`);
    ``train_transform`` is a per-sample dataset transform instead (give one or the other, not both)."""
    if batch_augment is not None and train_transform is not None:
        raise ValueError("image_class_incremental: give batch_augment or train_transform, not both (the samples "
                         "would be augmented twice).")
    x_train, y_train, x_test, y_test = prepared_tensors(data, info.mean, info.std, class_order, max_per_class)
    # continuum needs labels 0..k-1: number the kept classes densely, split, then report the original order
    dense = torch.full((max(class_order) + 1,), -1, dtype=torch.long)
    dense[sorted(class_order)] = torch.arange(len(class_order))
    info = dataclasses.replace(info, input_shape=tuple(x_train.shape[1:]),
                               batch_augment=batch_augment if batch_augment is not None else info.batch_augment)
    scenario = class_incremental(info, x_train, dense[y_train], x_test, dense[y_test],
                                 class_order=dense[list(class_order)].tolist(), train_transform=train_transform,
                                 holdout=holdout)
    scenario.info = dataclasses.replace(scenario.info, class_order=tuple(int(c) for c in class_order))
    return scenario


def crop_flip(size: int, padding: int) -> CropFlip:
    """Train augmentation: random crop after zero padding (zero is the mean colour of normalized inputs), then a
    random horizontal flip: :class:`clbench.augment.CropFlip`. Called on one ``(C, size, size)`` tensor its draws
    and output are those of ``v2.Compose([v2.RandomCrop(size, padding=padding), v2.RandomHorizontalFlip()])`` bit
    for bit; the image scenarios give it as ``batch_augment`` (:meth:`CropFlip.batch` on each minibatch)."""
    return CropFlip(size, padding)
