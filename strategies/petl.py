"""Parameter-efficient continual learning in He et al.'s unified view (ICLR 2022): a frozen pre-trained ViT
(``init``, e.g. from ``run_bench.py pretrain``) with PETL modules (:mod:`clbench.petl`) and a classifier.

For every method ``m`` of :data:`clbench.petl.METHODS` (prefix, adapter_seq, adapter_par, scaled_par_adapter,
mh_par_adapter, lora, mam, and the controls head_only and full_finetune) three strategies are registered:

- ``m``: ONE module set trained sequentially over the experiences with an incremental classifier (Avalanche's
  ``IncrementalClassifier``) and an optional rehearsal memory (``mem_size`` > 0; a kind of :data:`clbench.cl.MEMORIES`):
  each experience trains on ``D_t ∪ M``.
- ``m_per_task``: a fresh module set and a head over the experience's own classes per experience, trained on that
  experience alone. Task-incremental scenarios pick the set by the task label; class-incremental ones by the nearest
  class prototype (Euclidean) of the FROZEN backbone's features: ``k(x) = task of argmin_c ‖φ_0(x) - μ_c‖``,
  ``μ_c`` the mean ``φ_0`` of class ``c``'s training samples (a held-out part of each experience, at most
  ``route_holdout`` samples, is left out of ``μ_c``; the share of it routed to its own experience is the extra
  metric ``route_acc``, stored as ``φ_0`` features, not images).
- ``m_merge``: one module set per experience, every one trained from the SAME initial state on its experience
  alone, deployed as their parameter average ``θ̄ = (1/t) Σ_i θ_i`` with each experience's head on its own classes
  (model-soup-style merging; the non-linear counterpart of tangent model composition).

Training runs through Avalanche's ``SupervisedTemplate`` (:class:`PETLTemplate`, set up by
:class:`clbench.cl.PhasedTemplate`, which also trains on ``D_t ∪ M``), cross-entropy, and only the PETL parameters and
the classifier in the optimizer; the pre-trained backbone's weights stay bitwise unchanged. The controls go through
the same code: ``head_only`` has an empty module set (only the classifier trains: a linear probe), ``full_finetune``
a module set that is a trainable copy of the backbone (:meth:`clbench.petl.PETLViT.new_set`), so its ``_per_task``
form trains a whole ViT per experience (routed by the pre-trained ``φ_0``) and its ``_merge`` form averages whole
fine-tuned ViTs (a model soup). Extra metrics: ``trainable_pct`` = 100 · (parameters of one deployed module set,
backbone copy included) / (backbone parameters, head excluded): 0 for ``head_only``, 100 for ``full_finetune``; and
``route_acc`` for ``_per_task``.
"""

from __future__ import annotations

import copy
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from avalanche.models import IncrementalClassifier
from torch import Tensor, nn
from torch.nn import functional as F

from clbench.callbacks import bridge
from clbench.cl import MEMORIES, Phase, PhasedTemplate, build_memory, dataset_features
from clbench.petl import METHODS, MethodArgs, PETLSet, PETLViT, ViTShape, build_method, inject
from clbench.petl.methods import unused_fields
from clbench.privacy.step import PrivateTraining
from clbench.protocol import ClassificationInfo, ParamCount, StrategyBase
from clbench.registry import MODELS, STRATEGIES
from clbench.training import OPTIMIZERS, Schedule, build_optimizer
from clbench.typecheck import NON_NEGATIVE, setting

log = logging.getLogger(__name__)

OUTSIDE = -1e9      # logit of a class outside the head's own classes: exp(OUTSIDE - max) underflows to exactly 0


def vit_shape(model_args: dict) -> ViTShape:
    """The :class:`ViTShape` the ``vit`` model builds from ``model_args`` (its own defaults for keys left out)."""
    defaults = {k: p.default for k, p in inspect.signature(MODELS.get("vit")).parameters.items()
                if p.default is not inspect.Parameter.empty}
    a = {**defaults, **model_args}
    return ViTShape(depth=a["depth"], dim=a["embed_dim"], heads=a["num_heads"],
                    mlp_hidden=int(a["embed_dim"] * a["mlp_ratio"]))


@dataclass
class PETLStrategyConfig(MethodArgs):
    """Method sizes (:class:`clbench.petl.MethodArgs`) and training. Defaults: a dim-64 ViT, AdamW lr 1e-3 without
    weight decay, batch 32, 5 epochs per experience. Each strategy has its own subclass naming its ``method``
    (:func:`_register`), so the suite loader refuses, before any run, a field the method does not read, a size
    outside the method's rules (``size: 0``, ``prefix_length: -3``) and sizes beyond the ViT's dimensions."""

    method: ClassVar[str] = ""

    model_args: dict = field(default_factory=lambda: {"embed_dim": 64, "depth": 3, "num_heads": 4,
                                                      "patch_size": 4})
    init: str | None = None          # local checkpoint of the pre-trained ViT (run_bench.py pretrain); a
    #                                  "{scenario}" in the path is replaced by the scenario's name (runner)
    epochs: int = 5
    batch_size: int = 32
    eval_batch_size: int = 512
    optimizer: str = setting("adamw", choices=OPTIMIZERS.names)
    lr: float = 1e-3
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model_args.get("drop_path_rate"):
            raise ValueError(f"model_args.drop_path_rate {self.model_args['drop_path_rate']}: the PETL family runs "
                             f"its backbone in eval mode (frozen; full fine-tuning's copy too), so stochastic depth "
                             f"would never act; remove the key.")
        if self.method:
            unused = unused_fields(self.method, self)
            if unused:
                reads = ", ".join(METHODS.get(self.method).reads) or "no size setting"
                raise ValueError(f"{', '.join(unused)}: not used by the PETL method {self.method!r} (it reads "
                                 f"{reads}); remove the key.")
            build_method(self.method, self).check_fits(vit_shape(self.model_args))


@dataclass
class SharedConfig(PETLStrategyConfig):
    """One shared module set: an optional rehearsal memory of ``mem_size`` samples (0: none)."""

    mem_size: int = 0
    memory: str = setting("class_balanced", choices=MEMORIES.names)


@dataclass
class PerTaskConfig(PETLStrategyConfig):
    """A module set per experience: ``route_holdout`` samples per experience held out of the class prototypes to
    measure ``route_acc``."""

    route_holdout: int = setting(200, within=NON_NEGATIVE)


PRESETS: dict[str, dict] = {
    # the paper's sizes (r = 512, MAM's l = 30) need a wide backbone: a ViT-B-width model (GPU scale, not run here)
    "full": {"model_args": {"embed_dim": 768, "depth": 12, "num_heads": 12, "patch_size": 4}},
    # CPU scale (CPU_SCALE.md): dim-64 ViT, batch 32, 3 epochs per experience
    "cpu": {"epochs": 3, "batch_size": 32},
}


def method_presets(method: str) -> dict[str, dict]:
    """:data:`PRESETS` with the method's ``cpu`` sizes (declared where it registers: ``METHODS.get(method).cpu``)."""
    return {**PRESETS, "cpu": {**PRESETS["cpu"], **METHODS.get(method).cpu}}


# ------------------------------------------------------------------------------------------------------ models
class TaskHead(nn.Module):
    """A linear head over the classes ``classes`` of one experience: ``(B, d) -> (B, n_classes)`` with its columns
    filled and :data:`OUTSIDE` elsewhere (cross-entropy on it equals cross-entropy among the experience's classes)."""

    def __init__(self, dim: int, classes: range, n_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, len(classes))
        self.classes, self.n_classes = classes, n_classes

    def forward(self, features: Tensor) -> Tensor:
        out = features.new_full((len(features), self.n_classes), OUTSIDE)
        out[:, self.classes.start: self.classes.stop] = self.linear(features)
        return out


class PETLClassifier(nn.Module):
    """``logits = head(backbone(x))`` with the module set ``petl`` active (full fine-tuning: its copy of the
    backbone runs); the backbone stays in eval mode."""

    def __init__(self, backbone: PETLViT, petl: PETLSet, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.petl, self.head = backbone, petl, head

    def train(self, mode: bool = True) -> PETLClassifier:
        super().train(mode)
        self.backbone.eval()
        return self

    def features(self, x: Tensor) -> Tensor:
        with self.backbone.use(self.petl):
            return self.backbone(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class PETLTemplate(PhasedTemplate):
    """Avalanche's supervised loop on ``D_t ∪ M`` (:class:`PhasedTemplate`) with cross-entropy, whose optimizer holds
    only the trainable parameters (the module set, full fine-tuning's backbone copy included, and the head); a fresh
    optimizer per experience."""

    def __init__(self, *, model: PETLClassifier, config: PETLStrategyConfig, memory, device: torch.device) -> None:
        super().__init__(model=model, memory=memory, phase=Phase(epochs=config.epochs, schedule=Schedule(config.lr)),
                         batch_size=config.batch_size, eval_batch_size=config.eval_batch_size, device=device)
        self.config = config

    def feature_extractor(self) -> nn.Module:
        return self.model.backbone

    def make_optimizer(self, **kwargs) -> None:
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.config.optimizer, params, self.phase.schedule, self.config.weight_decay)

    def criterion(self) -> Tensor:
        return F.cross_entropy(self.mb_output, self.mb_y)

    def fit(self, experience) -> None:
        self.run_phase(self.phase, experience)


# --------------------------------------------------------------------------------------------------- strategies
class PETLStrategy(StrategyBase):
    """Shared part: the frozen injected ViT, the method's config, the template, counts. ``method`` names the
    :data:`~clbench.petl.METHODS` entry (set by the generated subclasses)."""

    method: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Config = PETLStrategyConfig
    PRESETS = PRESETS

    def __init__(self, info: ClassificationInfo, device: torch.device | str, config: PETLStrategyConfig) -> None:
        super().__init__(info, device, config)
        if config.init is None:
            log.warning("%s: no init checkpoint; the frozen backbone is a RANDOM ViT.", type(self).__name__)
        self.petl_config = build_method(self.method, config)
        vit = MODELS.get("vit")(info, **{**config.model_args, "init": config.init, "num_classes": 0})
        self.backbone = inject(vit, self.petl_config).to(self.device)
        self.backbone_params = sum(p.numel() for p in self.backbone.parameters())
        self.memory = build_memory(config.memory, config.mem_size) if isinstance(config, SharedConfig) else \
            build_memory("reservoir", 0)                  # per-experience sets: no rehearsal
        self.template = PETLTemplate(model=self.first_model(), config=config, memory=self.memory, device=self.device)
        bridge(self.template, self.callbacks)

    def first_model(self) -> nn.Module:
        """The model the template starts with."""
        raise NotImplementedError

    def new_set(self) -> PETLSet:
        return self.backbone.new_set(self.petl_config).to(self.device)

    def new_head(self, t: int) -> nn.Module:
        return TaskHead(self.backbone.shape.dim, self.info.class_range(t), self.info.n_classes).to(self.device)

    def _classifier(self, petl: PETLSet, head: nn.Module) -> PETLClassifier:
        return PETLClassifier(self.backbone, petl, head).to(self.device)

    @torch.no_grad()
    def base_features(self, x: Tensor) -> Tensor:
        """``φ_0(x)``: the frozen backbone's features without PETL modules, ``(B, d)``."""
        with self.backbone.use(None):
            return self.backbone(x.to(self.device))

    def deployed_backbone(self) -> tuple[nn.Module, ...]:
        """The frozen backbone when predictions run through it: not for full fine-tuning's shared and merged forms,
        whose module set carries the backbone they predict with."""
        return () if self.petl_config.train_backbone else (self.backbone,)

    def modules(self) -> dict[str, nn.Module]:
        """What callbacks hook: the model the template trains now (its module set, with full fine-tuning's backbone
        copy, and its head; the frozen backbone inside it has no trainable parameters)."""
        return {"model": self.template.model}

    def extra_metrics(self) -> dict[str, float]:
        """``trainable_pct``: the deployed module set (a reparametrized prefix counted merged, as He et al. count
        budgets; full fine-tuning: the whole backbone) over the backbone's parameters."""
        trained = self.petl_config.deployed_count(self.backbone.shape)
        if self.petl_config.train_backbone:
            trained += self.backbone_params
        return {"trainable_pct": 100.0 * trained / self.backbone_params}


class SharedPETL(PETLStrategy):
    summary = "PETL, one module set shared by all experiences (optional replay):"
    Config = SharedConfig
    private = True                         # each experience's data in its own call; dp refused with a memory

    def first_model(self) -> nn.Module:
        head = IncrementalClassifier(self.backbone.shape.dim, initial_out_features=self.info.classes_per_experience[0])
        self.model = self._classifier(self.new_set(), head)
        self.trained = 0
        return self.model

    def train(self, experience: Any) -> None:
        if self.callbacks.find(PrivateTraining) is not None:      # built in Python, not from a suite: the same need
            try:
                self.check_private(self.config)
            except ValueError as exc:
                raise ValueError(f"{type(self).__name__}: {exc}") from None
        self.template.fit(experience)
        self.trained += 1
        if self.trained == len(self.info.classes_per_experience):
            self.model.petl.merge_prefix()           # trained for the last time: drop the prefix MLP
        if self.config.mem_size:
            self.memory.update(experience.dataset, lambda ds: dataset_features(
                ds, self.base_features, self.config.eval_batch_size, self.device))

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        self.model.eval()
        return self.model(x.to(self.device))

    def num_parameters(self) -> ParamCount:
        """The deployed model: the frozen backbone (unless the set carries its own), the module set, the head."""
        return ParamCount.of(*self.deployed_backbone(), self.model.petl, self.model.head)


class _SetPerExperience(PETLStrategy):
    """Trains a module set and a :class:`TaskHead` per experience on that experience alone (no memory)."""

    def __init__(self, info: ClassificationInfo, device: torch.device | str, config: PETLStrategyConfig) -> None:
        super().__init__(info, device, config)
        self.sets, self.heads = nn.ModuleList(), nn.ModuleList()

    def first_model(self) -> nn.Module:
        return self.backbone                  # a placeholder: each experience brings its own model

    def initial_set(self) -> PETLSet:
        return self.new_set()

    def train(self, experience: Any) -> None:
        t = len(self.sets)
        model = self._classifier(self.initial_set(), self.new_head(t))
        self.template.model = model
        self.template.fit(experience)
        self.sets.append(model.petl.merge_prefix())   # final: a reparametrized prefix becomes its vectors
        self.heads.append(model.head)

    def num_parameters(self) -> ParamCount:
        return ParamCount.of(self.backbone, self.sets, self.heads)

    def _heads_logits(self, features: Tensor) -> Tensor:
        """Every head on its own classes: ``(B, n_classes)``, :data:`OUTSIDE` on classes not seen yet."""
        out = features.new_full((len(features), self.info.n_classes), OUTSIDE)
        for head in self.heads:
            out[:, head.classes.start: head.classes.stop] = head.linear(features)
        return out


class PerTaskPETL(_SetPerExperience):
    summary = "PETL, a module set per experience, routed by task label or nearest prototype:"
    Config = PerTaskConfig
    private = False                        # its routing prototypes are class means of the data, without noise

    def __init__(self, info: ClassificationInfo, device: torch.device | str, config: PETLStrategyConfig) -> None:
        super().__init__(info, device, config)
        self.prototypes = torch.zeros(0, self.backbone.shape.dim)           # (classes seen, d) on CPU
        self.owner = torch.zeros(0, dtype=torch.long)                       # experience of each prototype
        self.held: list[Tensor] = []                                        # held-out φ_0 per experience

    def train(self, experience: Any) -> None:
        super().train(experience)
        t = len(self.sets) - 1
        features = dataset_features(experience.dataset, self.base_features, self.config.eval_batch_size, self.device)
        targets = torch.as_tensor(list(experience.dataset.targets), dtype=torch.long)
        order = torch.randperm(len(targets))                                # the run's seeded global RNG
        n_held = min(self.config.route_holdout, len(targets) // 5)
        held, rest = order[:n_held], order[n_held:]
        self.held.append(features[held])
        classes = self.info.class_range(t)
        means = torch.stack([self._mean(features[rest][targets[rest] == c], features[targets == c]) for c in classes])
        self.prototypes = torch.cat((self.prototypes, means))
        self.owner = torch.cat((self.owner, torch.full((len(classes),), t, dtype=torch.long)))

    @staticmethod
    def _mean(kept: Tensor, every: Tensor) -> Tensor:
        """A class prototype from the samples not held out (all of them if the hold-out took every one)."""
        return (kept if len(kept) else every).mean(0)

    def route(self, features: Tensor) -> Tensor:
        """Experience of the nearest class prototype, ``(B,)``, for frozen features ``(B, d)``."""
        return self.owner[torch.cdist(features.cpu(), self.prototypes).argmin(dim=1)]

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        x = x.to(self.device)
        if self.info.task_aware and task_labels is not None:
            route = task_labels.cpu().long()
        else:
            route = self.route(self.base_features(x))
        out = x.new_full((len(x), self.info.n_classes), OUTSIDE)
        for t in route.unique().tolist():
            rows = (route == t).nonzero().flatten().to(self.device)
            model = self._classifier(self.sets[t], self.heads[t]).eval()
            out[rows] = model(x[rows])
        return out

    def extra_metrics(self) -> dict[str, float]:
        extra = {**super().extra_metrics(), "module_sets": float(len(self.sets))}
        held = [(f, t) for t, f in enumerate(self.held) if len(f)]
        if held and not self.info.task_aware:
            routed = torch.cat([self.route(f) == t for f, t in held])
            extra["route_acc"] = 100.0 * float(routed.float().mean())
        return extra


class MergedPETL(_SetPerExperience):
    summary = "PETL, per-experience module sets merged by parameter averaging:"
    private = True

    def __init__(self, info: ClassificationInfo, device: torch.device | str, config: PETLStrategyConfig) -> None:
        super().__init__(info, device, config)
        self.init_set = self.new_set().requires_grad_(False)
        self.merged = copy.deepcopy(self.init_set).merge_prefix()    # the trained sets are merged too

    def initial_set(self) -> PETLSet:
        return copy.deepcopy(self.init_set).requires_grad_(True)

    def train(self, experience: Any) -> None:
        super().train(experience)
        with torch.no_grad():
            for name, value in self.merged.named_parameters():
                value.copy_(torch.stack([dict(s.named_parameters())[name] for s in self.sets]).mean(0))

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        with self.backbone.use(self.merged):
            return self._heads_logits(self.backbone(x.to(self.device)))

    def num_parameters(self) -> ParamCount:
        """The deployed model: the frozen backbone (unless the merged set carries its own), the merged set, the heads
        (the per-experience sets are training-time)."""
        return ParamCount.of(*self.deployed_backbone(), self.merged, self.heads)


VARIANTS: dict[str, type[PETLStrategy]] = {"": SharedPETL, "_per_task": PerTaskPETL, "_merge": MergedPETL}


def _register() -> None:
    """``<method><suffix>`` for every method of :data:`METHODS` and every variant of :data:`VARIANTS`."""
    for method in METHODS.names():
        title = "".join(part.title() for part in method.split("_"))
        doc = (METHODS.get(method).__doc__ or method).splitlines()[0]
        for suffix, base in VARIANTS.items():
            config = type(f"{title}{base.Config.__name__}", (base.Config,), {"method": method, "__module__": __name__})
            cls = type(f"{title}{base.__name__}", (base,), {"method": method, "__module__": __name__,
                                                          "__doc__": f"{base.summary} {doc}", "Config": config,
                                                          "PRESETS": method_presets(method)})
            STRATEGIES.register(method + suffix)(cls)


_register()
