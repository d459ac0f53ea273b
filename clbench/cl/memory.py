"""The rehearsal-memory interface, its global budget check and the registry of memory kinds.

A memory holds at most ``K`` (``budget``) training samples of the stream seen so far, as Avalanche classification
datasets (``.subset``, ``.concat``, ``.targets``, ``.train()``/``.eval()``). After every :meth:`Memory.update` the
budget is checked: an implementation that would keep ``|M| > K`` raises :class:`BudgetExceeded` instead of being
truncated silently. Kinds register by name, so a strategy config can say ``memory: herding``::

    memory = build_memory("herding", budget=2000)
    memory.update(experience.dataset, features)      # features: dataset -> (n, F), used by herding only
    data = memory.dataset()                          # one Avalanche dataset, None while empty
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable

import torch
from torch import Tensor

from clbench.registry import Registry

DatasetFeatures = Callable[[object], Tensor]     # Avalanche dataset -> features φ(x) (n, F) in dataset order

MEMORIES: Registry = Registry("memory")


class BudgetExceeded(RuntimeError):
    """A memory update left more samples than the global budget ``K``."""


class Memory(ABC):
    """Samples of the stream seen so far under one global budget ``K``: ``|M| <= K`` after every update."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"a memory budget must be >= 0, got {budget}")
        self.budget = budget

    def update(self, dataset, features: DatasetFeatures | None = None) -> None:
        """Take a new experience's training ``dataset`` into account, then check ``|M| <= K``. ``features`` maps
        a dataset to its features ``(n, F)`` for kinds that select by features (herding); others ignore it."""
        self._update(dataset, features)
        if len(self) > self.budget:
            raise BudgetExceeded(f"{type(self).__name__} holds {len(self)} samples after an update, over its "
                                 f"budget of {self.budget}")

    @abstractmethod
    def _update(self, dataset, features: DatasetFeatures | None) -> None:
        """Select the new content; must keep ``len(self) <= self.budget`` (checked by :meth:`update`)."""

    @abstractmethod
    def parts(self) -> list:
        """The stored samples as non-empty Avalanche datasets (in a fixed order)."""

    def dataset(self):
        """All stored samples as one Avalanche dataset (``None`` while empty)."""
        parts = self.parts()
        if not parts:
            return None
        out = parts[0]
        for part in parts[1:]:
            out = out.concat(part)
        return out

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts())

    def counts(self) -> dict[int, int]:
        """``{class: stored samples}``, sorted by class."""
        counter = Counter(int(y) for part in self.parts() for y in part.targets)
        return dict(sorted(counter.items()))


def build_memory(kind: str, budget: int, **options) -> Memory:
    """A memory of a registered ``kind`` (``reservoir``, ``class_balanced``, ``herding``) with budget ``K``."""
    return MEMORIES.get(kind)(budget, **options)


def class_indices(dataset) -> dict[int, Tensor]:
    """``{class: indices of its samples}`` (classes ascending) for an Avalanche classification dataset."""
    targets = torch.as_tensor(list(dataset.targets), dtype=torch.long)
    return {int(c): (targets == c).nonzero().flatten() for c in targets.unique()}
