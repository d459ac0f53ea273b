"""Soft targets, label smoothing and MixUp (Zhang et al., 2018) on a batch, as DyTox+ uses them.

Label smoothing with ``ε`` over ``n`` classes: ``y = (1 - ε) · onehot + ε / n`` (``1 - ε + ε/n`` on the label).
MixUp pairs each image with the batch in reverse order and mixes images and targets with the same ``λ``:

    λ ~ Beta(α, α),    x̃_b = λ x_b + (1 - λ) x_{B-1-b},    ỹ_b = λ y_b + (1 - λ) y_{B-1-b}
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def label_smoothing(targets: Tensor, smoothing: float) -> Tensor:
    """``(1 - ε) · targets + ε / n`` for targets ``(B, n)`` (one-hot or soft; row sums are preserved)."""
    return targets * (1.0 - smoothing) + smoothing / targets.shape[1]


def soft_targets(y: Tensor, n_classes: int, smoothing: float = 0.0) -> Tensor:
    """Hard labels ``(B,)`` -> float targets ``(B, n_classes)``: one-hot, label-smoothed by ``ε``."""
    return label_smoothing(F.one_hot(y, n_classes).float(), smoothing)


def mix_lambda(alpha: float) -> float:
    """``λ ~ Beta(α, α)``, drawn from torch's global generator."""
    return float(torch.distributions.Beta(alpha, alpha).sample())


def mix_reversed(batch: Tensor, lam: float) -> Tensor:
    """``λ · batch + (1 - λ) · batch.flip(0)``: each row mixed with the row at the mirrored batch position."""
    return lam * batch + (1 - lam) * batch.flip(0)


def mixup(x: Tensor, targets: Tensor, alpha: float) -> tuple[Tensor, Tensor, float]:
    """MixUp of images ``(B, ...)`` and soft targets ``(B, n)`` with one ``λ ~ Beta(α, α)``: ``(x̃, ỹ, λ)``."""
    lam = mix_lambda(alpha)
    return mix_reversed(x, lam), mix_reversed(targets, lam), lam
