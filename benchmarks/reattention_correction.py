"""Re-Attention's score correction ``C_i σ_j² / 2`` and its spread across the keys of one query row (max_j − min_j
over the keys a query sees, in nats: the part the softmax does not cancel), for

- dp_vision's ViT shape (dim 64, depth 3, 4 heads, patch 4; randomly initialized), 250 CIFAR-100 test images,
  B̄ = 250, at the σ of dp_vision's ε 3 and ε 8 rows (1.7725, 0.9583);
- the seqrec model on Amazon Games (randomly initialized), 500 test users, exact item frequencies, at ``σ`` and
  ``B̄`` given on the command line.

    CLBENCH_DATA=<root> python benchmarks/reattention_correction.py 0.6 1024
"""

from __future__ import annotations

import sys

import torch

import clbench.models.vit as vit_module
import clbench.privacy.reattention as reattention
from clbench.data import CIFAR100, load
from clbench.models.seqrec import SeqRec
from clbench.models.vit import vit
from clbench.privacy.reattention import ErrorPrior
from clbench.protocol import ClassificationInfo
from clbench.scenarios.recommendation import GAMES_ITEMS, games_seqrec
from clbench.strategies.seqrec import item_frequency


def recording(module, seen: list) -> None:
    """Replace ``module.score_correction`` by a wrapper that keeps every correction it returns."""
    original = module.score_correction

    def spy(q, k_var):
        correction = original(q, k_var)
        seen.append(correction.detach())
        return correction
    module.score_correction = spy


def vit_spread() -> None:
    seen: list = []
    recording(vit_module, seen)
    torch.manual_seed(0)
    info = ClassificationInfo(name="c", n_classes=50, classes_per_experience=(10,) * 5, input_shape=(3, 32, 32))
    model = vit(info, embed_dim=64, depth=3, num_heads=4, patch_size=4, attention="reattention").eval()
    x = torch.tensor(load(CIFAR100).x_test[:250]).permute(0, 3, 1, 2).float() / 255
    x = (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), keepdim=True)
    for sigma in (1.7725, 0.9583):
        seen.clear()
        model.set_error_prior(ErrorPrior(sigma, 250.0))
        with torch.no_grad():
            model(x)
        spread = max(float((c.amax(-1) - c.amin(-1)).max()) for c in seen)
        print(f"vit sigma {sigma}: largest correction {max(float(c.max()) for c in seen):.3g} nats, largest spread "
              f"across a row's keys {spread:.3g} nats ({len(seen)} blocks)", flush=True)


def seqrec_spread(sigma: float, batch: float) -> None:
    seen: list = []
    recording(reattention, seen)
    scenario = games_seqrec()
    frequency = item_frequency(scenario.train_stream[0].dataset.x, GAMES_ITEMS)
    torch.manual_seed(0)
    model = SeqRec(GAMES_ITEMS, 50, attention="reattention").eval()
    model.set_error_prior(ErrorPrior(sigma, batch, frequency))
    x = scenario.test_stream[0].dataset.x[:500]
    with torch.no_grad():
        model.hidden(x)
    pad = x == 0
    allowed = torch.ones(50, 50, dtype=torch.bool).tril() & ~pad[:, None, None, :]
    for block, c in enumerate(seen):
        low = c.masked_fill(~allowed, float("inf")).amin(-1)
        high = c.masked_fill(~allowed, float("-inf")).amax(-1)
        spread = (high - low)[torch.isfinite(low) & ~pad[:, None, :]]
        print(f"seqrec games sigma {sigma} B {batch} block {block}: spread across a row's keys median "
              f"{float(spread.median()):.3g}, 90th percentile {float(spread.quantile(0.9)):.3g}, max "
              f"{float(spread.max()):.3g} nats", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    vit_spread()
    seqrec_spread(float(sys.argv[1]), float(sys.argv[2]))
