"""``seqrec``: a SASRec-style transformer with shared item embeddings (:mod:`clbench.models.seqrec`) trained for
next-item prediction through :func:`clbench.training.fit`, with vanilla attention or Re-Attention (Ding et al.,
ICML 2024). Sequential fine-tuning over experiences (no replay), so a continual stream shows forgetting.

Private training is a callback (the suite entry's ``dp:``, :class:`clbench.privacy.PrivateTraining`). Re-Attention's
:class:`~clbench.privacy.reattention.ErrorPrior` is set here before each training call with the token frequencies,
``error_scale`` and, as the noise, ``sigma_dp`` of the config and the batch size; the ``dp`` callback then replaces
that noise by its calibrated call's ``σ_dp``, clipping norm and expected batch size (as for any model exposing
``set_error_prior``). With neither, ``σ_dp = 0`` and Re-Attention equals vanilla attention. The
embedding rows' frequency prior ``p_j`` is the fraction of the experience's ``M`` training windows containing item
``j``. Trained privately, it is released by the Gaussian mechanism (:meth:`PrivateTraining.release`): the presence
counts ``c_j`` plus ``N(0, σ_f² L)`` (one window of length ``L`` holds at most ``L`` distinct items, so its presence
vector changes ``c`` by at most ``√L`` in L2 norm; ``σ_f = prior_noise``), ``p̃_j = clip(c̃_j / M, 0, 1)``, and its
cost is part of the run's ε (the training's σ is calibrated for the composition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from clbench.models.seqrec import BLOCKS, EMBEDDINGS, SeqRec, target_loss
from clbench.privacy.reattention import ACTIVATIONS, ATTENTIONS, ErrorPrior
from clbench.privacy.step import PrivateTraining
from clbench.protocol import NEXT_ITEM, ParamCount, ScenarioInfo, StrategyBase
from clbench.registry import STRATEGIES
from clbench.training import OPTIMIZERS, FitSettings, Schedule, fit
from clbench.typecheck import AT_LEAST_1, HALF_OPEN_FRACTION, NON_NEGATIVE, POSITIVE, RangeChecked, only_with, setting

REATTENTION = only_with("attention", "reattention")
"""Re-Attention's error model (σ_dp, its scale, the prior's noise) acts only with ``attention: reattention``."""


@dataclass
class SeqRecConfig(RangeChecked):
    """Defaults: the paper's model (2 blocks, d = 64, 1 head, learned positions, shared embeddings) with SASRec's
    training recipe (Adam 1e-3, batch 128, dropout 0.2, 200 epochs; the DP paper's own epochs/batch were not
    available here). ``sigma_dp``: Re-Attention's σ_dp when no DP callback supplies one; ``error_scale``
    multiplies every effective error σ_eff; ``prior_noise``: the noise multiplier ``σ_f`` of the private
    frequency prior (Re-Attention under ``dp``; 5 costs ε ≈ 0.53 alone at δ = 1/943 but, composed by RDP with
    dp_seqrec's 80 steps, raises their σ by under 1%). ``warmup``: the fraction of the steps of Ding et al.'s
    linear warm-up, then linear decay to 0, per step (None: constant lr); ``loss_positions = K``: the loss on each
    window's last K positions only (the latest K targets; None: every position) — the output layer scores all items
    at every trained position, which dominates the cost at a large vocabulary (Amazon Games: 23,715 items).
    ``norm``: where the blocks' LayerNorms sit, ``pre`` (SASRec's) or ``post`` (Vaswani et al.'s, the encoder of
    Ding et al., Appendix D.2); ``embeddings``: ``tied`` input/output item embeddings (their parameter sharing) or
    ``untied`` (their "w/o parameter sharing", Appendix D.5; at half the width: ``dim`` halved)
    (:mod:`clbench.models.seqrec`). Ding et al.'s recipe (Appendix D.3, D.6): dropout 0.2 (MovieLens) / 0.5
    (Amazon), Adam with weight decay 1e-5 (``weight_decay``, torch Adam's L2 term), 100 epochs with ``warmup: 0.2``."""

    dim: int = setting(64, within=AT_LEAST_1)
    depth: int = 2
    heads: int = setting(1, within=AT_LEAST_1)
    mlp_ratio: float = setting(4.0, within=POSITIVE)
    dropout: float = 0.2
    norm: str = setting("pre", choices=lambda: sorted(BLOCKS))                 # pre-LN or post-LN blocks
    embeddings: str = setting("tied", choices=lambda: sorted(EMBEDDINGS))      # output layer = input embedding?
    activation: str = setting("relu", choices=lambda: sorted(ACTIVATIONS))   # SASRec's FFN
    attention: str = setting("vanilla", choices=lambda: sorted(ATTENTIONS))
    optimizer: str = setting("adam", choices=OPTIMIZERS.names)
    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 200
    batch_size: int = 128
    eval_batch_size: int = 512
    sigma_dp: float | None = setting(None, within=NON_NEGATIVE, only_with=REATTENTION)   # Re-Attention's error
    error_scale: float = setting(1.0, within=NON_NEGATIVE, only_with=REATTENTION)        # model: its σ_dp, scale
    prior_noise: float = setting(5.0, within=POSITIVE, only_with=REATTENTION)            # and prior's noise
    warmup: float | None = setting(None, within=HALF_OPEN_FRACTION)   # a fraction: per-step warm-up then linear
    #                                                                   decay (FitSettings)
    loss_positions: int | None = setting(None, within=AT_LEAST_1)   # train on each window's last K positions only
    #                                                                 (None: all L)


def item_counts(x: Tensor, n_items: int) -> Tensor:
    """``(V + 1,)`` number of the windows ``x (M, L)`` that contain each item id (padding 0 excluded: 0)."""
    present = torch.zeros(len(x), n_items + 1, dtype=torch.bool)
    present.scatter_(1, x, True)
    counts = present.float().sum(0)
    counts[0] = 0.0
    return counts


def item_frequency(x: Tensor, n_items: int, dp: PrivateTraining | None = None, noise: float = 1.0) -> Tensor:
    """``(V + 1,)`` fraction of the windows ``x (M, L)`` that contain each item id (padding: 0); with ``dp``, the
    counts are released through it with noise multiplier ``noise`` at sensitivity ``√L`` and clipped to [0, 1]."""
    counts = item_counts(x, n_items)
    if dp is not None:
        counts = dp.release(counts, math.sqrt(x.shape[1]), noise)
        counts[0] = 0.0
    return (counts / len(x)).clamp(0.0, 1.0)


@STRATEGIES.register("seqrec")
class SequentialRecommender(StrategyBase):
    """SASRec-style next-item transformer, shared embeddings, vanilla attention or Re-Attention."""

    Config = SeqRecConfig
    scenario_kinds = (NEXT_ITEM,)          # item sequences; info.extra["n_items"] sizes the item table
    private = True          # one call per period, loss a batch mean; periods sharing users: share_samples (dp)
    PRESETS = {
        "cpu": {"epochs": 10, "batch_size": 128, "lr": 1e-2},
        "full": {},
        # Ding et al.'s private recipe (Appendix D): 100 epochs, 20% warm-up then linear decay, large batches, every
        # position trained; with the dp callback's automatic clipping (C = 1). A cell of the paper's batch x lr grid
        # ({256..4096} x {1e-3..9e-3}); GPU scale (Amazon Games: hours per epoch on one CPU core).
        "dp_paper": {"epochs": 100, "warmup": 0.2, "batch_size": 1024, "lr": 3e-3},
        # the same recipe cut to what one CPU core affords on Amazon Games (docs/seqrec.md): 3 epochs, the loss on
        # each user's latest target only (the tied output layer's 23.7k scores a position dominate the step)
        "games_cpu": {"epochs": 3, "warmup": 0.2, "batch_size": 1024, "lr": 5e-3, "loss_positions": 1},
    }

    @classmethod
    def check_entry(cls, config: SeqRecConfig, args: dict, private: bool) -> None:
        """Without ``dp`` Re-Attention has no noise to model unless ``sigma_dp`` gives one (σ_dp = 0: vanilla
        attention), and the frequency prior is exact (``prior_noise`` unused)."""
        if private:
            return
        if config.attention == "reattention" and config.sigma_dp is None:
            raise ValueError("attention: reattention corrects the noise of private training: without dp and without "
                             "sigma_dp its error is 0 and it trains as vanilla; add dp, set sigma_dp, or use "
                             "attention: vanilla.")
        if "prior_noise" in args:
            raise ValueError("prior_noise is the noise of the private release of Re-Attention's frequency prior, "
                             "used only under dp; remove it or add dp.")

    def __init__(self, info: ScenarioInfo, device: torch.device, config: SeqRecConfig) -> None:
        super().__init__(info, device, config)
        if "n_items" not in info.extra:
            raise ValueError(f"seqrec needs a next-item scenario (info.extra['n_items']); {info.name} has none.")
        c = config
        self.model = SeqRec(info.extra["n_items"], info.input_shape[0], c.dim, c.depth, c.heads, c.mlp_ratio,
                            c.dropout, c.activation, c.attention, c.norm, c.embeddings).to(self.device)
        self.seed = int(torch.randint(2**31 - 1, ()))        # drawn from the run's seeded global RNG
        self.steps = 0

    def train(self, experience) -> None:
        info = self.info
        dp = self.callbacks.find(PrivateTraining)
        if dp is not None and info.n_experiences > 1:
            dp.share_samples(info.n_experiences)     # a user's items return as history: compose over the periods
        data, c = experience.dataset, self.config
        x, y = data.x.to(self.device), data.y.to(self.device)
        if c.attention == "reattention":
            frequency = item_frequency(data.x, self.model.n_items, dp, c.prior_noise)
            self.model.set_error_prior(ErrorPrior(c.sigma_dp or 0.0, c.batch_size, frequency, c.error_scale))
        schedule = Schedule(c.lr) if c.warmup is None else Schedule(c.lr, per="step", warmup=c.warmup, decay="linear")
        settings = FitSettings(c.epochs, c.batch_size, schedule, c.optimizer, c.weight_decay)
        last = c.loss_positions
        if last is not None and last > y.shape[1]:
            raise ValueError(f"loss_positions {last} exceeds the windows' length {y.shape[1]}.")
        if last is not None:
            y = torch.cat([torch.zeros_like(y[:, :-last]), y[:, -last:]], 1)      # targets of the last K only
        self.model.train()
        # scores only where a target exists (packed rows; the every-position loss): the model sees (items, targets)
        self.steps += fit(self.model, lambda pairs: self.model(pairs[:, 0], targets=pairs[:, 1]),
                          self.model.parameters(), torch.stack([x, y], 1), y, lambda out, _: target_loss(out),
                          settings, seed=self.seed + experience.current_experience, callbacks=self.callbacks)
        self.model.eval()

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        self.model.eval()
        return torch.cat([self.model.last_scores(b.to(self.device)) for b in x.split(self.config.eval_batch_size)])

    def num_parameters(self) -> ParamCount:
        return ParamCount.of(self.model)

    def extra_metrics(self) -> dict[str, float]:
        prior = self.model.error_prior
        sigma = prior.sigma_dp if prior is not None else 0.0
        return {"optimizer_steps": float(self.steps), "reattention_sigma_dp": sigma}
