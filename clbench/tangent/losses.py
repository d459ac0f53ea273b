"""Training objectives of tangent models.

Rescaled square loss (Hui & Belkin, used by TAFT), for logits ``f: (B, K)`` and labels ``y: (B,)``::

    L(f, y) = (1/K) · ( α ([f]_y − κ)² + Σ_{i≠y} [f]_i² )          averaged over the batch

with ``α = 1``, ``κ = 15`` by default, plus the ridge penalty ``λ ‖Δ‖²`` on the tangent parameters. Cross-entropy is
the alternative (used for differentially private runs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from clbench.registry import Registry

LOSSES: Registry = Registry("tangent loss")


@LOSSES.register("mse")
def rescaled_square_loss(logits: Tensor, target: Tensor, alpha: float = 1.0, kappa: float = 15.0) -> Tensor:
    """``(1/K)(α([f]_y − κ)² + Σ_{i≠y}[f]_i²)`` averaged over the batch; ``logits: (B, K)``, ``target: (B,)``."""
    k = logits.shape[1]
    onehot = F.one_hot(target, k).to(logits.dtype)
    weight = 1.0 + (alpha - 1.0) * onehot
    return (weight * (logits - kappa * onehot).pow(2)).sum(1).mean() / k


@LOSSES.register("ce")
def cross_entropy(logits: Tensor, target: Tensor, alpha: float = 1.0, kappa: float = 15.0) -> Tensor:
    """Ordinary cross-entropy (``alpha`` and ``kappa`` are ignored)."""
    return F.cross_entropy(logits, target)


def ridge(params: Iterable[Tensor]) -> Tensor:
    """``‖Δ‖² = Σ Δ²`` over all tangent parameters."""
    return sum(p.pow(2).sum() for p in params)


@dataclass(frozen=True)
class TangentObjective:
    """``(logits, target, Δs=()) -> loss(logits, target) + λ ‖Δ‖²``. Picklable (``loss`` is a module-level
    function), so it travels with a training job to another process without a registry lookup there."""

    loss: Callable[..., Tensor]
    alpha: float
    kappa: float
    ridge_lambda: float

    def __call__(self, logits: Tensor, target: Tensor, deltas: Iterable[Tensor] = ()) -> Tensor:
        value = self.loss(logits, target, alpha=self.alpha, kappa=self.kappa)
        return value + self.ridge_lambda * ridge(deltas) if self.ridge_lambda else value


def tangent_objective(name: str, alpha: float, kappa: float, ridge_lambda: float) -> TangentObjective:
    """``loss + λ ‖Δ‖²`` for the loss registered as ``name``."""
    return TangentObjective(LOSSES.get(name), alpha, kappa, ridge_lambda)
