"""Experience -> DataLoader, tensors and features: the loops every strategy needs over an Avalanche dataset.

``train=True`` selects the dataset's ``train`` transform group (augmentation), ``False`` the ``eval`` group. A
shuffled loader with a ``seed`` draws its order from its own generator (same order on every call, global RNG
untouched); without a seed, from torch's global generator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader


def dataset_loader(dataset, batch_size: int, *, train: bool = False, shuffle: bool = False,
                   seed: int | None = None) -> DataLoader:
    """A DataLoader over an Avalanche dataset with its train or eval transforms."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    data = dataset.train() if train else dataset.eval()
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle, generator=generator)


def experience_loader(experience: Any, batch_size: int, *, train: bool = False, shuffle: bool = False,
                      seed: int | None = None) -> DataLoader:
    """:func:`dataset_loader` over ``experience.dataset``."""
    return dataset_loader(experience.dataset, batch_size, train=train, shuffle=shuffle, seed=seed)


def experience_tensors(experience: Any, batch_size: int = 1024) -> tuple[Tensor, Tensor]:
    """All ``(x, y)`` of an experience in dataset order, with its eval transform (no augmentation):
    ``x`` ``(n, ...)``, ``y`` ``(n,)`` long."""
    xs, ys = [], []
    for x, y, *_ in experience_loader(experience, batch_size):
        xs.append(x)
        ys.append(y)
    return torch.cat(xs), torch.cat(ys).long()


@torch.no_grad()
def dataset_features(dataset, feature_fn: Callable[[Tensor], Tensor], batch_size: int,
                     device: torch.device | str = "cpu") -> Tensor:
    """``φ(x)`` for every sample of ``dataset`` (eval transforms) in dataset order: ``(n, F)`` on CPU, where
    ``feature_fn`` maps a batch ``(B, ...)`` on ``device`` to ``(B, F)``."""
    return torch.cat([feature_fn(batch[0].to(device)).cpu() for batch in dataset_loader(dataset, batch_size)])
