"""DyTox and DyTox+ (Douillard et al., "DyTox: Transformers for Continual Learning with DYnamic TOken eXpansion",
CVPR 2022), following the paper and its official CIFAR configuration (``options/model/cifar_dytox*.yaml``).

Per task ``t`` (``|C_1:t|`` classes seen, ``|C_t|`` new), with the network of :mod:`clbench.models.dytox`:

1. Expansion: θ_t and Clf_t are added; for ``t > 0`` the teacher is a frozen copy of the model from BEFORE the
   expansion, θ_1..θ_{t-1} and Clf_1..Clf_{t-1} are frozen, the encoder and the TAB keep training.
2. Training on ``D_t ∪ M`` for ``epochs`` with

       L = (1 - α) · L_clf + α · L_kd + λ · L_div,        α = |C_1:t-1| / |C_1:t|,  λ = 0.1
       L_clf = BCE(σ(ŷ), y)                                y: (B, |C_1:t|) one-hot (soft with MixUp/smoothing)
       L_kd  = τ² · KL(softmax(ŷ^old_teacher / τ) ‖ softmax(ŷ_{1:|C_1:t-1|} / τ)),   τ = 1
       L_div = BCE(σ(Clf_div(e_t)), y_div)                 Clf_div: (B, D) -> (B, |C_t| + 1), training only

   ``y_div`` puts the mass of all old classes on column 0 and new class ``c`` on column ``c - |C_1:t-1| + 1``.
   As in the official code, KL and BCE are averaged over all elements (``reduction="mean"``).
   AdamW, lr ``5e-4 · bs / 512``, weight decay 1e-6 (none on biases and norms), per-epoch schedule: linear
   warm-up from 1e-6 for 5 epochs, then cosine ``lr_min + ½(lr - lr_min)(1 + cos(π e / E))`` with lr_min 1e-5.
3. Memory update: herding on ``[e_1, ..., e_t]`` under the global budget (:mod:`clbench.cl.herding`; the kind is
   ``config.memory``, a name in :data:`clbench.cl.MEMORIES`).
4. For ``t > 0``: balanced fine-tuning on the memory, encoder frozen, constant lr ``5e-5 · bs / 512``, 20 epochs,
   BCE only (no teacher, no divergence head): :func:`clbench.cl.balanced_finetuning`.

``dytox_plus`` adds MixUp (λ_mix ~ Beta(0.8, 0.8), each image mixed with the batch in reverse order) and label
smoothing 0.1 to the BCE targets: ``y = (1 - ε + ε/n) · onehot + ε/n · (1 - onehot)``, then mixed
(:mod:`clbench.cl.mixing`).

The loop is Avalanche's :class:`SupervisedTemplate` set up by :class:`clbench.cl.PhasedTemplate` (phases,
memory-only dataset, frozen encoder, per-epoch lr); DyTox overrides the expansion, optimizer, forward and criterion.
The strategy side is :class:`clbench.cl.PhasedStrategy`; the runner sees the :class:`~clbench.protocol.Strategy`
protocol.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import torch
from timm.optim import param_groups_weight_decay
from torch import Tensor, nn
from torch.nn import functional as F

from clbench.cl import (
    MEMORIES,
    Memory,
    Phase,
    PhasedStrategy,
    PhasedTemplate,
    balanced_finetuning,
    mixup,
    soft_targets,
)
from clbench.models.dytox import ARCHS, DyToxArch, DyToxNet, DyToxOutput, TaskClassifier
from clbench.protocol import ScenarioInfo
from clbench.registry import STRATEGIES
from clbench.training import Schedule, build_optimizer
from clbench.typecheck import AT_LEAST_1, HALF_OPEN_FRACTION, POSITIVE, RangeChecked, UsedOnlyWith, setting


# ------------------------------------------------------------------------------------------------------- config
@dataclass
class DyToxConfig(RangeChecked):
    """Hyperparameters; the defaults are the paper's CIFAR-100 setting (the ``full`` preset)."""

    arch: str = setting("cifar", choices=lambda: sorted(ARCHS))   # a key of clbench.models.dytox.ARCHS
    arch_overrides: dict = field(default_factory=dict)   # DyToxArch fields, e.g. {"patch_size": 2}
    mem_size: int = 2000                         # global rehearsal budget K
    memory: str = setting("herding", choices=MEMORIES.names)
    epochs: int = 500                            # per task
    first_epochs: int | None = setting(None, within=AT_LEAST_1)   # task 1 (None: same as ``epochs``)
    batch_size: int = 128
    lr: float = 5e-4                             # scaled by batch_size / 512
    weight_decay: float = 1e-6
    warmup_epochs: int = 5
    warmup_lr: float = setting(1e-6, only_with=UsedOnlyWith("warmup_epochs", lambda v: v > 0, "at least 1", 1))
    min_lr: float = 1e-5
    kd_tau: float = setting(1.0, within=POSITIVE)
    div_lambda: float = 0.1
    finetune_epochs: int = 20
    finetune_lr: float = 5e-5                    # scaled by batch_size / 512
    mixup_alpha: float = 0.0                     # 0: no MixUp
    label_smoothing: float = setting(0.0, within=HALF_OPEN_FRACTION)
    # batch augmentations (keys of AUGMENTATIONS) after the scenario's own (split_cifar100's batch_augment, the
    # official random crop (padding 4) + flip, applied to the minibatch first); the official recipe adds these two:
    augment: tuple[str, ...] = setting(("color_jitter", "randaugment"), choices=lambda: sorted(AUGMENTATIONS))
    crop_padding: int = setting(4, only_with=UsedOnlyWith("augment", lambda v: "crop" in v, "a list with crop",
                                                          ("crop",)))

    def __post_init__(self) -> None:
        super().__post_init__()
        fields = {f.name for f in dataclasses.fields(DyToxArch)}
        if set(self.arch_overrides) - fields:
            raise ValueError(f"unknown arch_overrides {sorted(set(self.arch_overrides) - fields)}; "
                             f"DyToxArch fields: {sorted(fields)}")
        self.augment = tuple(self.augment)


@dataclass
class DyToxPlusConfig(DyToxConfig):
    """DyTox+: MixUp Beta(0.8, 0.8) and label smoothing 0.1 on the (soft) BCE targets."""

    mixup_alpha: float = 0.8
    label_smoothing: float = setting(0.1, within=HALF_OPEN_FRACTION)


_CPU = {"arch": "tiny", "batch_size": 32, "augment": (), "warmup_epochs": 0}
PRESETS: dict[str, dict] = {
    "full": {},                                                          # paper, CIFAR-100 (GPU)
    "imagenet": {"arch": "imagenet"},                                    # paper model for 224px inputs (GPU)
    # CPU scale, not the paper's schedule: dim-64 / 3-SAB model, batch 32 (4x the updates of batch 128), 30 epochs
    # per task instead of 500, no warm-up, the paper's 20 fine-tuning epochs, step size lr·bs/512 = 5e-4 (4x the
    # paper's). At 2 epochs per task later tasks reached only 11-26% at their own step on split MNIST.
    "tiny": {**_CPU, "epochs": 30, "finetune_epochs": 20, "lr": 8e-3, "finetune_lr": 8e-4},
    # The quick suite on 8x8 digits: dim 32, 2 SABs, patch 2, 30 epochs per task (~450 updates) and the paper's 20
    # fine-tuning epochs. Below ~20 epochs per task the TAB's attention stays uniform, every task embedding e_i is
    # the same pooled feature and the frozen old heads' BCE collapses it (docs/dytox.md, "Training budget").
    "micro": {**_CPU, "arch_overrides": {"embed_dim": 32, "depth": 2, "num_heads": 4, "patch_size": 2},
              "mem_size": 200, "epochs": 30, "finetune_epochs": 20, "lr": 1.6e-2, "finetune_lr": 1.6e-3},
}


# ------------------------------------------------------------------------------------------------ augmentations
def random_crop(x: Tensor, padding: int, fill: Tensor | None = None) -> Tensor:
    """Per-image random crop of the padded batch ``(B, C, H, W)`` back to ``H x W``. ``fill`` ``(C,)`` is the
    padding value per channel (black, i.e. ``-mean/std`` on normalized images; 0 when None)."""
    batch, _, height, width = x.shape
    shift = 0.0 if fill is None else fill.to(x.device).view(1, -1, 1, 1)
    padded = F.pad(x - shift, (padding,) * 4) + shift
    dy = torch.randint(0, 2 * padding + 1, (batch, 1), device=x.device)
    dx = torch.randint(0, 2 * padding + 1, (batch, 1), device=x.device)
    rows = (dy + torch.arange(height, device=x.device))[:, None, :, None]
    cols = (dx + torch.arange(width, device=x.device))[:, None, None, :]
    b = torch.arange(batch, device=x.device)[:, None, None, None]
    c = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[b, c, rows, cols]


def black(info: ScenarioInfo) -> Tensor:
    """The normalized value of a black pixel, ``-mean/std`` per channel: ``(C,)``."""
    mean = torch.tensor(info.mean or (0.0,) * info.input_shape[0])
    std = torch.tensor(info.std or (1.0,) * info.input_shape[0])
    return -mean / std


def random_flip(x: Tensor) -> Tensor:
    """Horizontal flip of each image with probability 1/2."""
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def pixel_space(transform: Callable[[Tensor], Tensor], info: ScenarioInfo) -> Callable[[Tensor], Tensor]:
    """Apply a torchvision uint8 image transform per image: un-normalize with ``info.mean/std``, transform,
    normalize again."""
    mean = torch.tensor(info.mean or (0.0,)).view(-1, 1, 1)
    std = torch.tensor(info.std or (1.0,)).view(-1, 1, 1)

    def apply(x: Tensor) -> Tensor:
        m, s = mean.to(x.device), std.to(x.device)
        pixels = ((x * s + m).clamp(0, 1) * 255).round().to(torch.uint8)
        out = torch.stack([transform(img) for img in pixels]).float() / 255
        return (out - m) / s

    return apply


def _torchvision(name: str) -> Callable:
    from torchvision.transforms import v2
    return {"color_jitter": lambda: v2.ColorJitter(0.4, 0.4, 0.4),
            "randaugment": lambda: v2.RandAugment(num_ops=2, magnitude=9)}[name]()


# name -> factory(info, config) -> batch transform (B, C, H, W) -> (B, C, H, W) on normalized tensors
AUGMENTATIONS: dict[str, Callable[[ScenarioInfo, DyToxConfig], Callable[[Tensor], Tensor]]] = {
    "crop": lambda info, cfg: partial(random_crop, padding=cfg.crop_padding, fill=black(info)),
    "flip": lambda info, cfg: random_flip,
    "color_jitter": lambda info, cfg: pixel_space(_torchvision("color_jitter"), info),
    "randaugment": lambda info, cfg: pixel_space(_torchvision("randaugment"), info),
}


# ------------------------------------------------------------------------------------------------------- losses
def kd_loss(student_old: Tensor, teacher_old: Tensor, tau: float = 1.0) -> Tensor:
    """``τ² · KL(softmax(teacher/τ) ‖ softmax(student/τ))`` on the old-class logits ``(B, |C_1:t-1|)``, averaged
    over elements as in the official code."""
    log_student = F.log_softmax(student_old / tau, dim=1)
    log_teacher = F.log_softmax(teacher_old / tau, dim=1)
    return (log_teacher.exp() * (log_teacher - log_student)).mean() * tau ** 2


def divergence_targets(targets: Tensor, n_old: int) -> Tensor:
    """``(B, |C_1:t|)`` targets -> ``(B, |C_t| + 1)``: column 0 = total mass of the old classes, columns 1.. =
    the new classes (so a hard label ``c`` maps to 0 if ``c < n_old`` else ``c - n_old + 1``)."""
    return torch.cat((targets[:, :n_old].sum(dim=1, keepdim=True), targets[:, n_old:]), dim=1)


# ------------------------------------------------------------------------------------------------------- phases
def task_phase(config: DyToxConfig, t: int) -> Phase:
    """Task ``t`` on ``D_t ∪ M``: warm-up + cosine lr; from ``t = 1`` on, distillation and divergence head
    (``task_losses``) and the old task tokens and classifiers frozen."""
    epochs = config.first_epochs if t == 0 and config.first_epochs is not None else config.epochs
    schedule = Schedule(config.lr * config.batch_size / 512, warmup=config.warmup_epochs, warmup_lr=config.warmup_lr,
                        decay="cosine", min_lr=config.min_lr)
    return Phase(epochs=epochs, schedule=schedule, task_losses=t > 0, freeze_old_tasks=t > 0)


def finetune_phase(config: DyToxConfig) -> Phase:
    """Balanced fine-tuning on the memory, encoder frozen, constant lr ``finetune_lr · bs / 512``."""
    return balanced_finetuning(config.finetune_epochs, Schedule(config.finetune_lr * config.batch_size / 512))


# ----------------------------------------------------------------------------------------------------- template
class DyToxTemplate(PhasedTemplate):
    """Avalanche's supervised loop with DyTox's hooks; phases run through :meth:`PhasedTemplate.run_phase`."""

    def __init__(self, *, model: DyToxNet, info: ScenarioInfo, config: DyToxConfig, memory: Memory,
                 device: torch.device) -> None:
        super().__init__(model=model, memory=memory, phase=task_phase(config, 0), batch_size=config.batch_size,
                         eval_batch_size=config.batch_size, device=device)
        self.info, self.config = info, config
        self.teacher: DyToxNet | None = None
        self.div_head: TaskClassifier | None = None
        self.augmentations = [AUGMENTATIONS[name](info, config) for name in config.augment]
        self.mb_targets: Tensor | None = None

    # -- adaptation ---------------------------------------------------------------------------------------------
    def feature_extractor(self) -> nn.Module:
        return self.model.encoder

    def model_adaptation(self, model=None) -> DyToxNet:
        """Expansion when a new task starts (teacher copy, θ_t and Clf_t, divergence head), then the old task
        parameters frozen per phase; :class:`PhasedTemplate` freezes the encoder in the fine-tuning phase."""
        t = self.experience.current_experience
        if not self.phase.memory_only and self.model.n_tasks == t:     # a new task starts
            self.teacher = copy.deepcopy(self.model).requires_grad_(False).eval() if t > 0 else None
            self.model.add_task(self.info.classes_per_experience[t])
            self.div_head = (TaskClassifier(self.model.arch.embed_dim, self.info.classes_per_experience[t] + 1)
                             if t > 0 and self.config.div_lambda > 0 else None)
        self.model.set_trainable(old_tasks=not self.phase.freeze_old_tasks)
        if self.div_head is not None:
            self.div_head.requires_grad_(self.phase.task_losses).train(self.phase.task_losses)
        return super().model_adaptation(model)

    def make_optimizer(self, **kwargs) -> None:
        """AdamW over the trainable parameters (and the divergence head while distilling), at the phase's schedule;
        no weight decay on biases and other 1-D parameters, as timm's ``create_optimizer`` does for the official
        model (the groups carry their own weight decay)."""
        trainable = nn.ModuleDict({"net": self.model})
        if self.div_head is not None and self.phase.task_losses:
            trainable["div"] = self.div_head.to(self.device)
        groups = param_groups_weight_decay(trainable, self.config.weight_decay)
        self.optimizer = build_optimizer("adamw", groups, self.phase.schedule, self.config.weight_decay)

    # -- one iteration ------------------------------------------------------------------------------------------
    def _before_forward(self, **kwargs) -> None:
        """Batch augmentation, soft targets ``(B, |C_1:t|)`` and MixUp (the teacher sees the mixed images too)."""
        x = self.mb_x
        for augment in self.augmentations:
            x = augment(x)
        targets = soft_targets(self.mb_y, sum(self.model.classes_per_task), self.config.label_smoothing)
        if self.config.mixup_alpha > 0:
            x, targets, _ = mixup(x, targets, self.config.mixup_alpha)
        self.mbatch[0], self.mb_targets = x, targets
        super()._before_forward(**kwargs)

    def forward(self) -> DyToxOutput:
        return self.model(self.mb_x)

    def criterion(self) -> Tensor:
        out: DyToxOutput = self.mb_output
        loss = F.binary_cross_entropy_with_logits(out.logits, self.mb_targets)
        if not (self.phase.task_losses and self.teacher is not None):
            return loss
        with torch.no_grad():
            teacher_logits = self.teacher(self.mb_x).logits
        n_old = teacher_logits.shape[1]
        alpha = n_old / out.logits.shape[1]
        loss = (1 - alpha) * loss + alpha * kd_loss(out.logits[:, :n_old], teacher_logits, self.config.kd_tau)
        if self.div_head is not None:
            div_logits = self.div_head(out.embeddings[-1])
            loss = loss + self.config.div_lambda * F.binary_cross_entropy_with_logits(
                div_logits, divergence_targets(self.mb_targets, n_old))
        return loss


# ----------------------------------------------------------------------------------------------------- strategy
@STRATEGIES.register("dytox")
class DyTox(PhasedStrategy):
    """DyTox: a transformer with one task token and classifier per task, herding rehearsal (Douillard et al., 2022)."""

    Config = DyToxConfig
    PRESETS = PRESETS

    def build_model(self) -> DyToxNet:
        arch = replace(ARCHS[self.config.arch], **self.config.arch_overrides)
        return DyToxNet(arch, self.info.input_shape).to(self.device)

    def build_template(self) -> DyToxTemplate:
        return DyToxTemplate(model=self.model, info=self.info, config=self.config, memory=self.memory,
                             device=self.device)

    @property
    def feature_batch_size(self) -> int:
        return 2 * self.config.batch_size

    def train(self, experience) -> None:
        t = experience.current_experience
        self.template.run_phase(task_phase(self.config, t), experience)
        self.memory.update(experience.dataset, self.dataset_features)
        self.template.run_phase(finetune_phase(self.config), experience)

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        """Herding features ``[e_1, ..., e_t]``: ``(B, t·D)``."""
        self.model.eval()
        return torch.cat(self.model(x.to(self.device)).embeddings, dim=1)

    def extra_metrics(self) -> dict[str, float]:
        return {"task_tokens": float(self.model.n_tasks), "memory_used": float(len(self.memory))}


@STRATEGIES.register("dytox_plus")
class DyToxPlus(DyTox):
    """DyTox+ = DyTox with MixUp and label smoothing (:class:`DyToxPlusConfig`)."""

    Config = DyToxPlusConfig
