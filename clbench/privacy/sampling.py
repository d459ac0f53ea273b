"""Poisson sampling of minibatches, the sampling the privacy accountant assumes.

One epoch of ``steps = ⌈n/b⌉`` steps: at each step every one of the ``n`` samples enters the batch independently
with probability ``q = b/n`` (expected batch size ``b``, actual size Binomial(n, q)). A step whose draw is empty is
skipped by the loop (no forward is possible); the accountant still counts it (an upper bound — an empty step would
have released noise only). The probability of an empty step is ``(1 − q)^n ≈ e^{−b}``: ~1e-14 at ``b = 32``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PoissonPlan:
    """``steps_per_epoch`` Poisson draws at rate ``sample_rate`` over ``n`` samples; call with a generator for one
    epoch of index tensors (empty draws left out): a :data:`clbench.callbacks.BatchPlan`."""

    n: int
    sample_rate: float
    steps_per_epoch: int

    @classmethod
    def for_batch_size(cls, n: int, batch_size: int) -> PoissonPlan:
        if n < 1 or batch_size < 1:
            raise ValueError(f"Poisson sampling needs n >= 1 and batch_size >= 1, got n={n}, batch_size={batch_size}")
        return cls(n, min(1.0, batch_size / n), math.ceil(n / batch_size))

    def __call__(self, generator: torch.Generator) -> Iterator[Tensor]:
        for _ in range(self.steps_per_epoch):
            batch = (torch.rand(self.n, generator=generator) < self.sample_rate).nonzero().squeeze(1)
            if len(batch):
                yield batch


__all__ = ["PoissonPlan"]
