"""DyTox's rehearsal memory: one GLOBAL budget ``K`` shared by all classes, filled by iCaRL herding.

After task ``t`` every seen class keeps ``m = ⌊K / |C_1:t|⌋`` samples. New classes are herded on the features
``φ(x) = [e_1, ..., e_t]`` (the concatenated task embeddings, L2-normalized); old classes keep the first ``m`` of
their existing herding order. So ``len(memory) <= K`` always holds, whatever the number of loader workers or
devices (the official code's per-process memories summed above ``K``: see its ``erratum_distributed.md``).

iCaRL herding (Rebuffi et al., 2017) on class features ``φ_1..φ_n`` with mean ``μ``: pick, for ``k = 1..m``,

    p_k = argmin_j ‖ μ - (φ_j + Σ_{l<k} φ_{p_l}) / k ‖       (without replacement)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader

FeatureFn = Callable[[Tensor], Tensor]          # images (B, C, H, W) -> features (B, F)


def herding_order(features: Tensor, m: int) -> Tensor:
    """Indices of the first ``min(m, n)`` samples in iCaRL herding order for ``features`` ``(n, F)``."""
    features = F.normalize(features.double(), dim=1)
    mu = features.mean(dim=0)
    chosen: list[int] = []
    running = torch.zeros_like(mu)
    available = torch.ones(len(features), dtype=torch.bool)
    for k in range(1, min(m, len(features)) + 1):
        distance = (mu[None] - (running[None] + features) / k).norm(dim=1)
        distance[~available] = float("inf")
        pick = int(distance.argmin())
        chosen.append(pick)
        available[pick] = False
        running += features[pick]
    return torch.tensor(chosen, dtype=torch.long)


def class_indices(dataset) -> dict[int, Tensor]:
    """``{class: indices of its samples}`` for an Avalanche classification dataset."""
    targets = torch.as_tensor(list(dataset.targets), dtype=torch.long)
    return {int(c): (targets == c).nonzero().flatten() for c in targets.unique()}


@torch.no_grad()
def extract_features(dataset, feature_fn: FeatureFn, batch_size: int, device: torch.device | str) -> Tensor:
    """``φ(x)`` for every sample of ``dataset`` (its eval transforms), in dataset order: ``(n, F)`` on CPU."""
    loader = DataLoader(dataset.eval(), batch_size=batch_size, shuffle=False)
    return torch.cat([feature_fn(batch[0].to(device)).cpu() for batch in loader])


class HerdingMemory:
    """Per-class exemplar datasets (Avalanche dataset subsets, in herding order) under a global budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.per_class: dict[int, object] = {}

    def __len__(self) -> int:
        return sum(len(d) for d in self.per_class.values())

    def counts(self) -> dict[int, int]:
        return {c: len(d) for c, d in sorted(self.per_class.items())}

    def quota(self, n_classes: int) -> int:
        """``m = ⌊K / n_classes⌋`` exemplars per class."""
        return self.budget // n_classes

    def update(self, dataset, feature_fn: FeatureFn, batch_size: int = 256,
               device: torch.device | str = "cpu") -> None:
        """Add the classes of ``dataset`` (a new task's training data) by herding, then truncate every class to
        the new quota. Old classes are truncated in their herding order, never re-herded."""
        groups = class_indices(dataset)
        quota = self.quota(len(self.per_class.keys() | groups.keys()))
        for c in self.per_class:
            self.per_class[c] = self.per_class[c].subset(range(min(quota, len(self.per_class[c]))))
        if quota == 0:
            self.per_class = {}
            return
        for c, idx in groups.items():
            class_data = dataset.subset(idx.tolist())
            order = herding_order(extract_features(class_data, feature_fn, batch_size, device), quota)
            self.per_class[c] = class_data.subset(order.tolist())

    def dataset(self):
        """All exemplars as one Avalanche dataset (``None`` while empty)."""
        parts = [d for d in self.per_class.values() if len(d)]
        if not parts:
            return None
        out = parts[0]
        for part in parts[1:]:
            out = out.concat(part)
        return out
