"""iCaRL herding memory (Rebuffi et al., 2017) under one GLOBAL budget ``K``, as DyTox uses it.

After task ``t`` every seen class keeps ``m = ⌊K / |C_1:t|⌋`` exemplars. New classes are herded on the features
``φ(x)`` the strategy supplies (DyTox: the concatenated task embeddings ``[e_1, ..., e_t]``), L2-normalized; old
classes keep the first ``m`` of their existing herding order. So ``|M| <= K`` always holds, whatever the number of
loader workers or devices (DyTox's official per-process memories summed above ``K``: its ``erratum_distributed.md``).

Herding on class features ``φ_1..φ_n`` with mean ``μ`` picks, for ``k = 1..m``,

    p_k = argmin_j ‖ μ - (φ_j + Σ_{l<k} φ_{p_l}) / k ‖       (without replacement)
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from clbench.cl.memory import MEMORIES, DatasetFeatures
from clbench.cl.per_class import PerClassMemory


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


@MEMORIES.register("herding")
class HerdingMemory(PerClassMemory):
    """Herding exemplars, ``⌊K / |C_1:t|⌋`` per seen class; :meth:`update` needs ``features``."""

    def quotas(self, available: dict[int, int]) -> dict[int, int]:
        """``m = ⌊K / |C_1:t|⌋`` for every class (a class with fewer samples keeps them all)."""
        m = self.budget // len(available) if available else 0
        return dict.fromkeys(available, m)

    def select(self, class_data, quota: int, features: DatasetFeatures | None) -> Tensor:
        if features is None:
            raise ValueError("the herding memory selects by features: call update(dataset, features)")
        return herding_order(features(class_data), quota)
