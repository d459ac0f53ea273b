"""Reservoir memory: Vitter's algorithm R over the stream of training samples, class-agnostic.

Items get global stream positions ``i = 0, 1, ...`` in arrival order. The first ``K`` fill the slots; item
``i >= K`` draws ``j ~ U{0, ..., i}`` and replaces slot ``j`` if ``j < K``. After ``n`` items every one of them is
in the memory with the same probability ``K / n`` (by induction: item ``i`` enters with ``K/(i+1)`` and survives
item ``l > i`` with ``1 - 1/(l+1) = l/(l+1)``; the product telescopes to ``K/n``).
"""

from __future__ import annotations

import numpy as np

from clbench.cl.memory import MEMORIES, DatasetFeatures, Memory


class Reservoir:
    """Algorithm R on stream positions: ``slots`` holds the positions kept (at most ``capacity``)."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self.capacity, self.seen = capacity, 0
        self.slots: list[int] = []
        self.rng = np.random.default_rng(seed)

    def offer(self, n: int) -> None:
        """Process the next ``n`` stream items (positions ``seen .. seen + n - 1``)."""
        positions = np.arange(self.seen, self.seen + n)
        fill = max(0, min(n, self.capacity - len(self.slots)))
        self.slots.extend(positions[:fill].tolist())
        rest = positions[fill:]
        j = self.rng.integers(0, rest + 1)                   # j ~ U{0..i} for each item i
        for i, slot in zip(rest[j < self.capacity].tolist(), j[j < self.capacity].tolist()):
            self.slots[slot] = i
        self.seen += n


@MEMORIES.register("reservoir")
class ReservoirMemory(Memory):
    """Reservoir sampling over every training sample of the stream (``seed``: the draws ``j``)."""

    def __init__(self, budget: int, seed: int = 0) -> None:
        super().__init__(budget)
        self.reservoir = Reservoir(budget, seed)
        self.sources: dict[int, object] = {}            # first stream position -> that experience's dataset

    def _update(self, dataset, features: DatasetFeatures | None) -> None:
        self.sources[self.reservoir.seen] = dataset
        self.reservoir.offer(len(dataset))
        self.sources = {start: d for start, d in self.sources.items() if self._local(start, d)}

    def _local(self, start: int, dataset) -> list[int]:
        """Indices into ``dataset`` (stream positions ``start ..``) of the slots it fills, in slot order."""
        return [p - start for p in self.reservoir.slots if start <= p < start + len(dataset)]

    def parts(self) -> list:
        return [d.subset(self._local(start, d)) for start, d in self.sources.items()]
