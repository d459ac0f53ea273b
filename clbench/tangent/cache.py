"""Per-sample cache of the frozen prefix: ``h_i = prefix(x_i): (N, D)`` tokens after the blocks that carry no Δ.

The prefix of a tangent model sees ``ẋ = 0`` (unless the CLS token is tangent), so its output depends on the input
only. Computing it once per training sample lets every later epoch run just the last ``k`` tangent blocks. Inputs
are then used without random augmentation (a cached prefix is a function of the stored sample).
"""

from __future__ import annotations

import torch
from torch import Tensor

from clbench.tangent.model import TangentModel


@torch.no_grad()
def cache_prefix(model: TangentModel, x: Tensor, batch_size: int = 256) -> Tensor:
    """``prefix(x)`` for every sample: ``x: (M, C, H, W) -> (M, N, D)`` on ``x``'s device, computed in batches."""
    if not model.prefix_cacheable:
        raise ValueError("this tangent model has a tangent CLS token: its prefix carries a tangent and cannot be "
                         "cached; train it uncached.")
    return torch.cat([model.prefix(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])
