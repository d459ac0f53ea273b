"""Re-Attention's score correction ``C_i σ_j² / 2`` and its spread across the keys of one query row (max_j − min_j
over the keys a query sees, in nats: the part the softmax does not cancel), for

- dp_vision's ViT shape (dim 64, depth 3, 4 heads, patch 4; randomly initialized), 250 CIFAR-100 test images,
  B̄ = 250, at the σ of dp_vision's ε 3 and ε 8 rows (1.7725, 0.9583);
- the seqrec model on Amazon Games (randomly initialized), 500 test users, exact item frequencies, at ``σ`` and
  ``B̄`` given on the command line.

    CLBENCH_DATA=<root> python benchmarks/reattention_correction.py 0.6 1024

With ``--runs``, on a suite's own trained models instead: each ``<out>/artifacts/<run_id>`` folder's
model snapshot rebuilt with its record's hyperparameters (any norm or embeddings option), its error prior set from
the record (``reattention_sigma_dp`` of its extra metrics, its batch size, the exact item frequencies of the training
windows: the private release's noise left out), and, per block, the total variation by which the correction moves
each scored query row's attention, ``TV_i = ½ Σ_j |softmax_j(s_ij) − softmax_j(s_ij − C_i σ_j²/2)|`` over the keys
``j`` query ``i`` may see (item positions of 500 test users), printed as median / 90th percentile / max::

    CLBENCH_DATA=<root> python benchmarks/reattention_correction.py --runs \
        results/dp_seqrec_games_paper/artifacts/games__eps8_reattention_b2048_lr3e-3__s0 ...
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

import clbench.models.vit as vit_module
import clbench.privacy.reattention as reattention
from clbench.data import CIFAR100, load
from clbench.models.seqrec import SeqRec
from clbench.models.vit import vit
from clbench.privacy.reattention import CausalSelfAttention, ErrorPrior
from clbench.protocol import ClassificationInfo
from clbench.records import read as read_record
from clbench.runner import record_path
from clbench.scenarios.recommendation import GAMES_ITEMS, games_seqrec
from clbench.specs import RunSpec
from clbench.strategies.seqrec import item_frequency

sys.path.insert(0, str(Path(__file__).parent))
from seqrec_attention_distraction import SCENARIO, recorded  # noqa: E402  (a run's model rebuilt from its snapshot)


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


@torch.no_grad()
def correction_tv(model: SeqRec, x: torch.Tensor) -> list[torch.Tensor]:
    """Per block, ``TV_i`` (module docstring) of every non-padding query of ``x (B, L)``, under the model's prior."""
    inputs: list[tuple] = []
    hooks = [block.attn.register_forward_pre_hook(lambda _m, args: inputs.append(args)) for block in model.blocks]
    with torch.no_grad():
        model.hidden(x)
    for hook in hooks:
        hook.remove()
    tvs = []
    for block, (a, pad, a_var, param_var, *_) in zip(model.blocks, inputs):
        attn = block.attn
        q = attn._split(attn.q(a)) / math.sqrt(attn.head_dim)
        scores = q @ attn._split(attn.k(a)).transpose(-1, -2)                       # (B, H, L, L)
        n = x.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool).tril() & ~pad[:, None, None, :] | torch.eye(n, dtype=torch.bool)
        plain = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        corrected = (scores - attn.correction(q, a, a_var, param_var)).masked_fill(~allowed, float("-inf")).softmax(-1)
        tv = 0.5 * (plain - corrected).abs().sum(-1)                                  # (B, H, L)
        tvs.append(tv.permute(0, 2, 1)[~pad].flatten())
    return tvs


def runs_tv(folders: list[str], scenario=None, expected: tuple[str, dict] = SCENARIO, users: int = 500) -> dict:
    """``{run_id: [TV of each block]}`` of each run (module docstring), printed as it goes; ``scenario`` (built from
    ``expected`` when None) gives the exact item frequencies and the first ``users`` test windows. A run whose
    attention is vanilla, or whose record has no positive ``reattention_sigma_dp`` among its extra metrics, is
    refused."""
    scenario = scenario or games_seqrec(**expected[1])
    n_items = scenario.info.extra["n_items"]
    frequency = item_frequency(scenario.train_stream[0].dataset.x, n_items)
    x = scenario.test_stream[0].dataset.x[:users]
    found = {}
    for folder in folders:
        record = read_record(record_path(Path(folder).parents[1], Path(folder).name))
        (run_id, model, _), = recorded([folder], scenario, expected)
        sigma = record["metrics"].get("extra", {}).get("reattention_sigma_dp")
        if model.blocks[0].attn.__class__ is CausalSelfAttention or not sigma:
            raise SystemExit(f"{run_id}: not a private Re-Attention run (attention vanilla or sigma_dp 0).")
        config = RunSpec.from_dict(record["spec"]).config()
        model.set_error_prior(ErrorPrior(sigma, config.batch_size, frequency, config.error_scale))
        found[run_id] = correction_tv(model.eval(), x)
        for block, tv in enumerate(found[run_id]):
            print(f"{run_id} block {block}: attention moved by the correction, total variation median "
                  f"{float(tv.median()):.3g}, 90th percentile {float(tv.quantile(0.9)):.3g}, max "
                  f"{float(tv.max()):.3g} ({len(tv)} query rows; sigma_dp {sigma:.4g}, B {config.batch_size})",
                  flush=True)
    return found


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["--runs"]:
        runs_tv(sys.argv[2:])
    else:
        vit_spread()
        seqrec_spread(float(sys.argv[1]), float(sys.argv[2]))
