"""Per-class memories: each seen class keeps its exemplars in a selection order, and shrinking a class keeps the
first ``q_c`` of that order (so exemplars are never re-selected from data that is gone).

An update with the training data of a new experience computes a quota ``q_c`` for every class from what each has
available (old classes: the exemplars they hold; new classes: all their samples), truncates the old classes to
their quota and selects ``q_c`` exemplars of each new class. A class that appears again is re-selected from its new
data. Subclasses choose the quotas (``Σ_c q_c <= K``) and the selection order.
"""

from __future__ import annotations

from abc import abstractmethod

from torch import Tensor

from clbench.cl.memory import DatasetFeatures, Memory, class_indices


class PerClassMemory(Memory):
    """Per-class exemplar datasets (Avalanche subsets in selection order) under a global budget ``K``."""

    def __init__(self, budget: int) -> None:
        super().__init__(budget)
        self.per_class: dict[int, object] = {}

    @abstractmethod
    def quotas(self, available: dict[int, int]) -> dict[int, int]:
        """Exemplars ``q_c`` per class after an update, given the samples ``n_c`` each class has available."""

    @abstractmethod
    def select(self, class_data, quota: int, features: DatasetFeatures | None) -> Tensor:
        """Indices of the first ``min(quota, n)`` samples of one class's dataset in selection order."""

    def _update(self, dataset, features: DatasetFeatures | None) -> None:
        groups = class_indices(dataset)
        available = {c: len(d) for c, d in self.per_class.items()} | {c: len(i) for c, i in groups.items()}
        quotas = self.quotas(available)
        for c in self.per_class:
            self.per_class[c] = self.per_class[c].subset(range(min(quotas[c], len(self.per_class[c]))))
        for c, idx in groups.items():
            if quotas[c] > 0:
                class_data = dataset.subset(idx.tolist())
                self.per_class[c] = class_data.subset(self.select(class_data, quotas[c], features).tolist())
        self.per_class = {c: d for c, d in self.per_class.items() if len(d)}

    def parts(self) -> list:
        return list(self.per_class.values())

    def counts(self) -> dict[int, int]:
        return {c: len(d) for c, d in sorted(self.per_class.items())}
