"""From uint8 image arrays to the normalized float tensors scenarios hold in memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


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
    images = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2).float().div_(255)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return images.sub_(mean_t).div_(std_t).contiguous()


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``(N, H, W, C)`` uint8 images scaled to [0, 1] (float64 accumulation)."""
    flat = x.reshape(-1, x.shape[-1])
    mean = flat.mean(axis=0, dtype=np.float64) / 255
    sq = np.square(flat, dtype=np.float64).mean(axis=0) / 255**2
    return tuple(mean.round(4).tolist()), tuple(np.sqrt(sq - mean**2).round(4).tolist())
