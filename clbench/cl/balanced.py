"""Class-balanced memory: an equal share of the global budget ``K`` per seen class (GDumb-style balance).

Shares are max-min fair (water-filling): a class with fewer samples than its share keeps them all, and the budget
left over is split evenly among the others, the remainder going one sample each to the lowest class ids. So the
counts of classes that have enough samples differ by at most 1, and ``Σ_c q_c = min(K, Σ_c n_c)``.

Selection inside a class is ``random`` (a seeded permutation, so every kept set is a uniform random subset of the
class) or ``first`` (first come, first kept: dataset order). Shrinking keeps a prefix of that order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from clbench.cl.memory import MEMORIES, DatasetFeatures
from clbench.cl.per_class import PerClassMemory

# name -> (n, generator) -> an order of range(n)
SELECTIONS: dict[str, Callable[[int, torch.Generator], Tensor]] = {
    "random": lambda n, generator: torch.randperm(n, generator=generator),
    "first": lambda n, generator: torch.arange(n),
}


def balanced_quotas(available: dict[int, int], budget: int) -> dict[int, int]:
    """Max-min fair shares of ``budget`` for classes with ``available[c]`` samples (water-filling)."""
    quotas: dict[int, int] = {}
    remaining, left = budget, sorted(available)
    while left:
        share = remaining // len(left)
        capped = [c for c in left if available[c] <= share]
        if not capped:
            break
        for c in capped:
            quotas[c] = available[c]
            remaining -= available[c]
        left = [c for c in left if c not in quotas]
    if left:
        share, extra = divmod(remaining, len(left))
        quotas.update({c: share + (i < extra) for i, c in enumerate(left)})
    return quotas


@MEMORIES.register("class_balanced")
class ClassBalancedMemory(PerClassMemory):
    """An equal share of ``K`` per seen class; ``selection`` ``random`` (seeded) or ``first``."""

    def __init__(self, budget: int, selection: str = "random", seed: int = 0) -> None:
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {sorted(SELECTIONS)}, got {selection!r}")
        super().__init__(budget)
        self.order = SELECTIONS[selection]
        self.generator = torch.Generator().manual_seed(seed)

    def quotas(self, available: dict[int, int]) -> dict[int, int]:
        return balanced_quotas(available, self.budget)

    def select(self, class_data, quota: int, features: DatasetFeatures | None) -> Tensor:
        return self.order(len(class_data), self.generator)[:quota]
