"""DER: Dynamically Expandable Representation (Yan, Xie and He, CVPR 2021), following the paper and its official
code (``Rhyssiyan/DER-ClassIL.pytorch``, ``exps/der_womask/cifar100/b0/10steps``). Registered as ``der``
(Avalanche's dark experience replay is ``der_dark``).

Per task ``t`` (``|C_1:t-1|`` old classes, ``|C_t|`` new ones), with the network of :mod:`clbench.models.der`:

1. Expansion: ``F_t`` is added as a copy of ``F_{t-1}``; ``F_1..F_{t-1}`` are frozen (no gradient, eval mode);
   the unified classifier ``W_H`` over ``Φ_t(x) = [F_1(x); ...; F_t(x)]`` is rebuilt with the old weights copied
   in; for ``t > 1`` an auxiliary classifier ``W_a: (B, d) -> (B, |C_t| + 1)`` is created on ``F_t`` alone.
2. Training on ``D_t ∪ M`` (SGD, momentum 0.9, weight decay 5e-4, linear warm-up then step decay) with

       L = L_H + λ_a · L_a,          λ_a = 1 for t > 1 (no auxiliary loss on the first task)
       L_H = CE(W_H Φ_t(x), y)
       L_a = CE(W_a F_t(x), y_a),    y_a = 0 if y < |C_1:t-1| else y - |C_1:t-1| + 1   (all old classes -> "old")

3. Memory update: iCaRL herding on ``Φ_t(x)`` under the global budget ``K`` (``config.memory``, a kind in
   :data:`clbench.cl.MEMORIES`; ``|M| <= K`` is checked after every update).
   With ``prune``, the new extractor's channels are gated and ``λ_s · L_S`` (the soft fraction of convolution
   weights in use) is added, the mask scale annealed batch by batch (:mod:`clbench.models.channel_masks`).
4. Classifier correction for ``t > 1``, one of :data:`CORRECTIONS` (``config.correction``):

   - ``retrain`` (the official "classifier learning stage", the default): ``W_H`` re-initialized, then trained
     alone on the class-balanced memory with all extractors frozen, ``CE(W_H Φ_t(x) / T, y)``, ``T = 5``,
     30 epochs, SGD lr 0.1, decayed ×0.1 at epoch 15 (:func:`clbench.cl.balanced_finetuning` with the step schedule).
   - ``weight_align`` (Zhao et al., CVPR 2020; PyCIL's DER): the rows of the new classes are scaled,
     ``W_new ← γ W_new`` with ``γ = mean_{c old} ‖W_c‖ / mean_{c new} ‖W_c‖``.
   - ``none``.

The loop is Avalanche's :class:`SupervisedTemplate` set up by :class:`clbench.cl.PhasedTemplate` (phases,
memory-only dataset, frozen extractors, per-epoch lr); DER overrides the expansion, the optimizer, the forward pass
and the criterion; the strategy side (:class:`clbench.cl.PhasedStrategy`) bridges the strategy's callbacks into it.
Not reproduced: the official warm-up's classifier reset at the end of warm-up, and its extra ColorJitter
(docs/der.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from clbench.cl import MEMORIES, Memory, Phase, PhasedStrategy, PhasedTemplate, balanced_finetuning
from clbench.models.channel_masks import (
    add_gates,
    annealed_scale,
    kept_parameters,
    reset_gates,
    set_scale,
    sparsity_loss,
)
from clbench.models.checkpoint import load_weights
from clbench.models.classifier import build_backbone
from clbench.models.der import DERNet, DEROutput, der_linear
from clbench.protocol import ClassificationInfo
from clbench.registry import MODELS, STRATEGIES
from clbench.training import OPTIMIZERS, Schedule, build_optimizer
from clbench.typecheck import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, RangeChecked, only_with, setting

# ------------------------------------------------------------------------------------------------------- config
PRUNING = only_with("prune", True)
"""The channel-mask pruning's own settings act only with ``prune: true``."""


@dataclass
class DERConfig(RangeChecked):
    """Hyperparameters; the defaults are the official CIFAR-100 B0 schedule (the ``full`` preset). The backbone is
    the scenario's unless ``model`` names one: the official CIFAR extractor is ``model: resnet18`` (suite
    ``der_full``)."""

    model: str = setting("auto", choices=lambda: ["auto", *MODELS.names()])   # every F_t ("auto": the scenario's)
    model_args: dict = field(default_factory=dict)
    init: str | None = None                      # local checkpoint loaded into F_1
    copy_old_classifier: bool = True             # copy W_H's old block when it is rebuilt
    mem_size: int = 2000                         # global rehearsal budget K
    memory: str = setting("herding", choices=MEMORIES.names)
    epochs: int = 170                            # per task t > 1
    milestones: tuple[int, ...] = setting((100, 120), within=NON_NEGATIVE)   # lr × lr_decay at these epochs
    first_epochs: int | None = setting(200, within=AT_LEAST_1)   # task 1 ("pretrain" stage); None: ``epochs``
    first_milestones: tuple[int, ...] = (60, 120, 160)
    lr_decay: float = setting(0.1, within=POSITIVE)
    warmup_epochs: int = 10                      # linear warm-up from 0 (tasks t > 1)
    batch_size: int = 128
    eval_batch_size: int = 256
    optimizer: str = setting("sgd", choices=OPTIMIZERS.names)
    lr: float = 0.1
    momentum: float = setting(0.9, only_with=only_with("optimizer", "sgd"))
    weight_decay: float = 5e-4
    aux_lambda: float = 1.0                      # λ_a
    correction: str = setting("retrain", choices=lambda: sorted(CORRECTIONS))   # a key of CORRECTIONS (below)
    retrain_epochs: int = 30
    retrain_lr: float = 0.1
    retrain_milestones: tuple[int, ...] = (15,)
    retrain_weight_decay: float = setting(5e-4, within=NON_NEGATIVE)
    retrain_temperature: float = 5.0             # T
    retrain_reset: bool = True                   # re-initialize W_H before re-training it (official)
    # optional pruning (clbench.models.channel_masks; CIFAR ResNets only): L += λ_s · L_S on the new extractor
    prune: bool = False
    prune_lambda: float = setting(1.0, only_with=PRUNING)   # λ_s (not given in the sources read: docs/der.md)
    prune_s_max: float = setting(400.0, within=Range(1, open_low=True), only_with=PRUNING)   # s_max (HAT's)
    prune_init: float = setting(1.0, within=POSITIVE, only_with=PRUNING)   # e_l at each task's start (all open)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.milestones, self.first_milestones = tuple(self.milestones), tuple(self.first_milestones)
        self.retrain_milestones = tuple(self.retrain_milestones)


_CPU = {"batch_size": 32, "eval_batch_size": 512, "warmup_epochs": 0, "milestones": (), "first_milestones": (),
        "retrain_milestones": ()}
PRESETS: dict[str, dict] = {
    "full": {},                                   # official CIFAR-100 B0 schedule (GPU; not run here)
    # CPU scale (not the paper's schedule): the scenario's default backbone per extractor (suite `der`: the small
    # CNN on CIFAR, the MLP on MNIST), batch 32, constant lr 0.05, 6 epochs per task (10 for the first), 10
    # re-training epochs.
    "cpu": {**_CPU, "model": "auto", "epochs": 6, "first_epochs": 10, "lr": 0.05, "retrain_epochs": 10,
            "retrain_lr": 0.05},
    # 8x8 digits (quick suite): the MLP, 10 epochs per task, memory 200.
    "micro": {**_CPU, "model": "auto", "epochs": 10, "first_epochs": 10, "lr": 0.05, "mem_size": 200,
              "retrain_epochs": 10, "retrain_lr": 0.05},
}


# ------------------------------------------------------------------------------------------------------- losses
def aux_targets(y: Tensor, n_old: int) -> Tensor:
    """Targets of the auxiliary head ``(B,)``: 0 for every old class (``y < n_old``), ``y - n_old + 1`` for a new
    class, so column 0 is "old" and columns ``1..|C_t|`` are the new classes in order."""
    return torch.where(y >= n_old, y - n_old + 1, torch.zeros_like(y))


def weight_align(classifier: nn.Linear, n_new: int) -> float:
    """Weight aligning (Zhao et al., 2020): scale the last ``n_new`` rows of ``W`` by
    ``γ = mean_{old c} ‖W_c‖₂ / mean_{new c} ‖W_c‖₂`` in place; returns ``γ``."""
    with torch.no_grad():
        norms = classifier.weight.norm(dim=1)
        gamma = norms[:-n_new].mean() / norms[-n_new:].mean()
        classifier.weight[-n_new:] *= gamma
    return float(gamma)


# ------------------------------------------------------------------------------------------------------- phases
def task_phase(config: DERConfig, t: int) -> Phase:
    """Task ``t`` (0-based) on ``D_t ∪ M``: SGD with warm-up (``t > 0``) and step decay; the auxiliary loss and
    the frozen old extractors from ``t = 1`` on."""
    first = t == 0
    epochs = config.first_epochs if first and config.first_epochs is not None else config.epochs
    schedule = Schedule(config.lr, warmup=0 if first else config.warmup_epochs,
                        milestones=config.first_milestones if first else config.milestones, gamma=config.lr_decay)
    return Phase(epochs=epochs, schedule=schedule, task_losses=not first and config.aux_lambda > 0,
                 freeze_old_tasks=not first)


def retrain_phase(config: DERConfig) -> Phase:
    """The classifier learning stage: memory only, every extractor frozen, step schedule."""
    return balanced_finetuning(config.retrain_epochs, Schedule(config.retrain_lr, milestones=config.retrain_milestones,
                                                               gamma=config.lr_decay))


# ----------------------------------------------------------------------------------------------------- template
class DERTemplate(PhasedTemplate):
    """Avalanche's supervised loop with DER's hooks; phases run through :meth:`PhasedTemplate.run_phase`.

    The constructor draws the initialization of a throw-away ``nn.Linear(1, 1)`` from the global RNG: DER's template
    built one as its placeholder optimizer's parameters before the setup was shared, and the draw keeps the RNG
    stream (the first extractor is built after it, at the first task) and so every DER record the same."""

    def __init__(self, *, model: DERNet, info: ClassificationInfo, config: DERConfig, memory: Memory,
                 device: torch.device) -> None:
        nn.Linear(1, 1)                                   # the recorded RNG stream (class docstring)
        super().__init__(model=model, memory=memory, phase=task_phase(config, 0), batch_size=config.batch_size,
                         eval_batch_size=config.eval_batch_size, device=device)
        self.info, self.config = info, config
        self.aux_head: nn.Linear | None = None
        self.n_old = 0

    def feature_extractor(self) -> nn.Module:
        return self.model.extractors

    def model_adaptation(self, model=None) -> DERNet:
        """Expansion when a new task starts (``F_t``, ``W_H``, the auxiliary head); before re-training, ``W_H``
        re-initialized (``retrain_reset``). :class:`PhasedTemplate` freezes the extractors while re-training; frozen
        parameters lose their stale ``.grad``, so no frozen extractor holds a gradient during a phase."""
        t = self.experience.current_experience
        if self.phase.memory_only:
            if self.config.retrain_reset:
                self.model.classifier.reset_parameters()
        elif self.model.n_tasks == t:                                        # a new task starts
            self.n_old = self.model.n_classes
            n_new = self.info.classes_per_experience[t]
            self.model.add_task(n_new)
            if self.config.prune:
                reset_gates(self.model.extractors[-1], self.config.prune_init)
            self.aux_head = der_linear(self.model.out_dim, n_new + 1) if self.phase.task_losses else None
        model = super().model_adaptation(model)
        for p in self.model.parameters():              # frozen parameters drop the gradients of their last phase
            if not p.requires_grad:
                p.grad = None
        return model

    def make_optimizer(self, **kwargs) -> None:
        """``config.optimizer`` over the trainable parameters (and the auxiliary head in a task phase), at the
        phase's schedule. Avalanche also calls this once before the first expansion, when there is nothing to
        optimize yet: skipped."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if not trainable:
            return
        cfg = self.config
        if self.phase.memory_only:
            weight_decay = cfg.retrain_weight_decay
        else:
            weight_decay = cfg.weight_decay
            if self.aux_head is not None:
                trainable += list(self.aux_head.to(self.device).parameters())
        self.optimizer = build_optimizer(cfg.optimizer, trainable, self.phase.schedule, weight_decay, cfg.momentum)

    def _before_training_iteration(self, **kwargs) -> None:
        """With ``prune``: the new extractor's mask scale ``s`` annealed over the epoch's batches."""
        if self.config.prune and not self.phase.memory_only:
            s = annealed_scale(self.clock.train_epoch_iterations + 1, len(self.dataloader), self.config.prune_s_max)
            set_scale(self.model.extractors[-1], s)
        super()._before_training_iteration(**kwargs)

    def forward(self) -> DEROutput:
        return self.model(self.mb_x)

    def criterion(self) -> Tensor:
        out: DEROutput = self.mb_output
        if self.phase.memory_only:
            return F.cross_entropy(out.logits / self.config.retrain_temperature, self.mb_y)
        loss = F.cross_entropy(out.logits, self.mb_y)
        if self.phase.task_losses and self.aux_head is not None:
            aux = self.aux_head(out.features[-1])
            loss = loss + self.config.aux_lambda * F.cross_entropy(aux, aux_targets(self.mb_y, self.n_old))
        if self.config.prune:
            loss = loss + self.config.prune_lambda * sparsity_loss(self.model.extractors[-1])
        return loss


# -------------------------------------------------------------------------------------------------- corrections
def _retrain(strategy: DER, experience) -> None:
    strategy.template.run_phase(retrain_phase(strategy.config), experience)


def _weight_align(strategy: DER, experience) -> None:
    t = experience.current_experience
    if t > 0:
        weight_align(strategy.model.classifier, strategy.info.classes_per_experience[t])


# name -> correction(strategy, experience), run after the memory update of every task
CORRECTIONS: dict[str, Callable[[DER, object], None]] = {
    "retrain": _retrain,
    "weight_align": _weight_align,
    "none": lambda strategy, experience: None,
}


# ----------------------------------------------------------------------------------------------------- strategy
@STRATEGIES.register("der")
class DER(PhasedStrategy):
    """DER: one new frozen-after-use feature extractor per task, herding rehearsal (Yan et al., 2021)."""

    Config = DERConfig
    PRESETS = PRESETS

    def build_model(self) -> DERNet:
        model = DERNet(partial(self._first_extractor, self.info, self.config), self.config.copy_old_classifier)
        if self.config.prune:                         # a backbone that cannot be pruned fails before any training
            self._first_extractor(self.info, self.config)
        return model

    def build_template(self) -> DERTemplate:
        return DERTemplate(model=self.model, info=self.info, config=self.config, memory=self.memory,
                           device=self.device)

    @property
    def feature_batch_size(self) -> int:
        return self.config.eval_batch_size

    @staticmethod
    def _first_extractor(info: ClassificationInfo, config: DERConfig) -> nn.Module:
        extractor = build_backbone(info, config.model, config.model_args)
        if config.init:
            load_weights(extractor, config.init)
        return add_gates(extractor, config.prune_init) if config.prune else extractor

    def train(self, experience) -> None:
        self.template.run_phase(task_phase(self.config, experience.current_experience), experience)
        self.memory.update(experience.dataset, self.dataset_features)
        CORRECTIONS[self.config.correction](self, experience)

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        """Herding features ``Φ_t(x) = [F_1(x); ...; F_t(x)]``: ``(B, t·d)``."""
        self.model.eval()
        return torch.cat(self.model.features(x.to(self.device)), dim=1)

    def pruned_parameters(self) -> int:
        """Parameters of the network with every masked channel removed: each pruned extractor, and ``W_H``'s
        columns for the features the extractors keep (``prune`` only)."""
        kept = [kept_parameters(extractor) for extractor in self.model.extractors]
        return sum(n for n, _ in kept) + self.model.n_classes * sum(features for _, features in kept)

    def extra_metrics(self) -> dict[str, float]:
        """Extractors, memory used and, with ``prune``, ``params_pruned_M`` (the pruned network, millions)."""
        extra = {"extractors": float(self.model.n_tasks), "memory_used": float(len(self.memory))}
        if self.config.prune:
            extra["params_pruned_M"] = self.pruned_parameters() / 1e6
        return extra
