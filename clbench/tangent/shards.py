"""Exact removal of training data from a composition of tangent models trained on disjoint shards.

The deployed ``Δ`` is the weighted average ``Δ = S / W`` of shard deltas, kept as the running sums
``S = Σ_i w_i Δ_i`` and ``W = Σ_i w_i``. Forgetting the samples of shard ``j`` subtracts its term —
``S ← S − w_j Δ_j``, ``W ← W − w_j`` — at no training cost, and the result is the composition of the remaining
shards (the removed samples never influenced any other shard).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

Delta = Mapping[str, Tensor]


def split_shards(n_samples: int, n_shards: int, seed: int) -> list[Tensor]:
    """A seeded random partition of ``0..n_samples-1`` into ``n_shards`` disjoint, near-equal index sets."""
    if not 1 <= n_shards <= n_samples:
        raise ValueError(f"cannot split {n_samples} samples into {n_shards} non-empty shards.")
    perm = torch.randperm(n_samples, generator=torch.Generator().manual_seed(seed))
    return [chunk.sort().values for chunk in perm.tensor_split(n_shards)]


def delta_hash(delta: Delta) -> str:
    """SHA-256 (first 16 hex digits) of the Δ tensors, in name order: identifies a deployed model."""
    digest = hashlib.sha256()
    for name in sorted(delta):
        digest.update(name.encode())
        digest.update(delta[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass
class ShardComposition:
    """Shard deltas ``Δ_i`` with weights ``w_i`` and the running sums ``S = Σ w_i Δ_i``, ``W = Σ w_i``."""

    deltas: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    weights: dict[int, float] = field(default_factory=dict)
    total: dict[str, Tensor] = field(default_factory=dict)
    mass: float = 0.0

    def add(self, shard: int, delta: Delta, weight: float = 1.0) -> None:
        """``S ← S + w Δ``, ``W ← W + w``."""
        if shard in self.deltas:
            raise KeyError(f"shard {shard} is already in the composition.")
        self.deltas[shard] = {k: v.detach().clone() for k, v in delta.items()}
        self.weights[shard] = float(weight)
        for name, value in delta.items():
            term = weight * value.detach()
            self.total[name] = self.total[name] + term if name in self.total else term.clone()
        self.mass += weight

    def subtract(self, shards: Sequence[int]) -> None:
        """``S ← S − w_j Δ_j``, ``W ← W − w_j`` for each shard ``j`` (no retraining)."""
        for shard in shards:
            delta, weight = self.deltas.pop(shard), self.weights.pop(shard)
            for name, value in delta.items():
                self.total[name] = self.total[name] - weight * value
            self.mass -= weight

    def delta(self) -> dict[str, Tensor]:
        """The deployed ``Δ = S / W``."""
        if not self.deltas:
            raise ValueError("the composition has no shard left.")
        return {name: value / self.mass for name, value in self.total.items()}

    @property
    def shards(self) -> list[int]:
        return sorted(self.deltas)
