"""Avalanche's baseline strategies behind the clbench strategy protocol.

One adapter, :class:`AvalancheStrategy`, wraps any ``SupervisedTemplate``: it builds the model
(:func:`clbench.models.classifier.build_classifier`), the optimizer and the template, trains one experience per
``train`` call with Avalanche's own loop, and predicts with ``avalanche_forward`` in eval mode. Each baseline is a
subclass that names its Avalanche class, its hyperparameters (a dataclass whose defaults follow the method's paper
or Avalanche) and its presets.

Defaults (``full``) and sources: naive/cumulative/joint/replay/EWC/LwF use SGD lr 0.01 momentum 0.9; iCaRL
(Rebuffi et al., 2017): memory 2000, SGD lr 2.0, wd 1e-5, batch 128, 70 epochs, BCE with distillation;
dark experience replay (Buzzega et al., 2020): alpha 0.1, beta 0.5 (DER++ when beta > 0, DER when 0);
EWC (Kirkpatrick et al., 2017) lambda 100 (``separate`` penalties); LwF (Li & Hoiem, 2016) alpha 1, T 2;
GDumb (Prabhu et al., 2020) memory 2000, retrained from scratch on the memory at every step.

Buffer samples forwarded outside the minibatch: the bridge augments each training minibatch with the scenario's
batch augmentation (:meth:`clbench.callbacks.CallbackList.augment_batch`), replayed samples a replay data loader
joined to it included. A strategy that draws buffer samples of its own in training (DER's replay batch, ER-ACE's,
A-GEM's reference batch, ...) reads them through :func:`augmented_buffer`: the same augmentation, where the dataset's
per-sample train transform acted on them before the image scenarios declared it as a batch augmentation. A pass over
the experience's training data that a plugin makes with a data loader of its own (EWC's Fisher, MAS's importance,
feature replay's stored features) reads it through :func:`augmented_loaders`, for the same reason.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar
from unittest import mock

import torch
from avalanche.models.utils import avalanche_forward
from avalanche.training import DER, EWC, Cumulative, GDumb, ICaRL, JointTraining, LwF, Naive, Replay
from avalanche.training.losses import ICaRLLossPlugin
from avalanche.training.plugins import EvaluationPlugin, EWCPlugin, SupervisedPlugin
from avalanche.training.plugins import ewc as avalanche_ewc
from avalanche.training.supervised import icarl as avalanche_icarl
from avalanche.training.supervised import strategy_wrappers
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from clbench import progress
from clbench.callbacks import CallbackBridge, CallbackList, bridge
from clbench.models.checkpoint import load_weights
from clbench.models.classifier import HEADS, build_classifier
from clbench.precision import in_float32
from clbench.protocol import ClassificationInfo, ParamCount, StrategyBase
from clbench.registry import MODELS, STRATEGIES
from clbench.training import OPTIMIZERS, Schedule, build_optimizer
from clbench.typecheck import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, RangeChecked, only_with, setting

SGD_ONLY = only_with("optimizer", "sgd")
"""A field of SGD's only (``momentum``): Adam and AdamW keep torch's beta1."""


@dataclass
class TrainConfig(RangeChecked):
    """Hyperparameters every Avalanche baseline shares."""

    model: str = setting("auto", choices=lambda: ["auto", *MODELS.names()])   # "auto": the scenario's default
    model_args: dict = field(default_factory=dict)
    head: str = setting("auto", choices=lambda: ["auto", *HEADS])   # "auto": multi if task-aware, else incremental
    init: str | None = None             # local checkpoint loaded into the backbone
    epochs: int = 1
    batch_size: int = 32
    eval_batch_size: int = 512
    optimizer: str = setting("sgd", choices=OPTIMIZERS.names)
    lr: float = 0.01
    momentum: float = setting(0.9, only_with=SGD_ONLY)  # Adam and AdamW keep torch's beta1
    weight_decay: float = 0.0


# Presets shared by every baseline: ``cpu`` sizes runs for 2-core machines (see CPU_SCALE.md: small batches give
# enough updates per step), ``full`` is the common GPU setting of the class-incremental literature.
CPU = {"epochs": 2, "batch_size": 32, "optimizer": "adam", "lr": 1e-3}
FULL = {"epochs": 70, "batch_size": 128, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}


class _EpochProgress(SupervisedPlugin):
    """Advances the epoch progress bar."""

    def __init__(self, epochs: int) -> None:
        super().__init__()
        self.epochs, self.bar = epochs, None

    def before_training_exp(self, strategy, **kwargs):
        self.bar = progress.bar(total=self.epochs, desc="epochs", level="epochs")

    def after_training_epoch(self, strategy, **kwargs):
        self.bar.update()

    def after_training_exp(self, strategy, **kwargs):
        self.bar.close()


def _augmenting_callbacks(template: SupervisedTemplate) -> CallbackList | None:
    """The clbench callbacks bridged into ``template`` when they carry a batch augmentation, else None."""
    for plugin in template.plugins:
        if isinstance(plugin, CallbackBridge) and plugin.callbacks.batch_augment is not None:
            return plugin.callbacks
    return None


def train_augment(template: SupervisedTemplate) -> Callable[[Tensor], Tensor] | None:
    """The scenario's batch augmentation of the clbench callbacks bridged into ``template``
    (:meth:`~clbench.callbacks.CallbackList.augment_batch`), None when it has none (or no callbacks are bridged)."""
    callbacks = _augmenting_callbacks(template)
    return None if callbacks is None else callbacks.augment_batch


class AugmentedBatches:
    """The batches ``(x, *rest)`` of ``batches`` with ``x`` -> ``augment(x)``: ``next()`` draws from an iterator (a
    replay ``cycle``), iterating makes a fresh pass over an iterable (a ``DataLoader``)."""

    def __init__(self, batches: Iterable, augment: Callable[[Tensor], Tensor]) -> None:
        self.batches, self.augment = batches, augment

    def __iter__(self):
        return (self._augmented(batch) for batch in self.batches)

    def __len__(self) -> int:
        """The batches of a pass (a ``DataLoader``'s length; Avalanche's importance passes average over it)."""
        return len(self.batches)

    def __next__(self) -> list:
        return self._augmented(next(self.batches))

    def _augmented(self, batch) -> list:
        x, *rest = batch
        return [self.augment(x), *rest]


def augmented_buffer(template: SupervisedTemplate, batches: Iterable | None) -> Iterable | None:
    """``batches`` (a buffer's loader or iterator, read by a strategy in training outside the bridged minibatch)
    with each batch's inputs through :func:`train_augment` (module docstring); ``batches`` itself when the scenario
    has no batch augmentation or there are none."""
    augment = train_augment(template)
    return batches if augment is None or batches is None else AugmentedBatches(batches, augment)


@contextmanager
def augmented_loaders(template: SupervisedTemplate, module: Any, name: str = "DataLoader") -> Iterator[None]:
    """While open, each data loader that ``module`` builds through its attribute ``name`` (Avalanche's EWC and MAS
    plugins' ``DataLoader`` over the experience's training data) comes wrapped by :func:`augmented_buffer`: every
    batch's inputs through the scenario's batch augmentation, once, where the dataset's per-sample train transform
    acted on them before. Nothing is patched when the scenario has no batch augmentation."""
    if train_augment(template) is None:
        yield
        return
    build = getattr(module, name)

    def loader(*args, **kwargs):
        return augmented_buffer(template, build(*args, **kwargs))

    with mock.patch.object(module, name, loader):
        yield


def unaugmented_minibatch(template: SupervisedTemplate) -> Tensor | None:
    """The template's current training minibatch before the scenario's batch augmentation
    (:attr:`clbench.callbacks.CallbackList.unaugmented`); None when the scenario has none (``mb_x`` is then as the
    data loader gave it) or no callbacks are bridged."""
    callbacks = _augmenting_callbacks(template)
    return None if callbacks is None else callbacks.unaugmented


class AvalancheStrategy(StrategyBase):
    """Adapter from an Avalanche ``SupervisedTemplate`` to the clbench protocol (see module docstring); the
    template fires the strategy's callbacks (:func:`clbench.callbacks.bridge`)."""

    template_cls: ClassVar[type[SupervisedTemplate]]
    head: ClassVar[str] = ""           # forces a head kind (e.g. "fixed") regardless of the config
    Config: ClassVar[type] = TrainConfig
    PRESETS: ClassVar[dict[str, dict]] = {"cpu": CPU, "full": FULL}

    @classmethod
    def check_entry(cls, config: Any, args: dict, private: bool) -> None:
        """A strategy that builds its own head (``head`` class attribute) refuses a ``head`` setting."""
        if cls.head and args.get("head", "auto") != "auto":
            raise ValueError(f"head {args['head']!r}: this strategy always builds its own {cls.head} head, so the "
                             f"setting would change nothing; remove head.")

    def __init__(self, info: ClassificationInfo, device: torch.device, config: Any) -> None:
        super().__init__(info, device, config)
        head = self.head or (config.head if config.head != "auto" else ("multi" if info.task_aware else
                                                                         "incremental"))
        self.model = build_classifier(info, config.model, config.model_args, head=head)
        if config.init:
            load_weights(self.model.feature_extractor, config.init)
        # a constant rate: Avalanche's template keeps the optimizer's rate for the whole run
        optimizer = build_optimizer(config.optimizer, self.model.parameters(), Schedule(config.lr),
                                    config.weight_decay, config.momentum)
        common = dict(optimizer=optimizer, train_mb_size=config.batch_size, train_epochs=config.epochs,
                      eval_mb_size=config.eval_batch_size, device=self.device, plugins=[_EpochProgress(config.epochs)],
                      evaluator=EvaluationPlugin(loggers=[]))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No loggers specified")
            self.template = self.make_template(self.model, common)
        bridge(self.template, self.callbacks)

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        """The Avalanche strategy; subclasses add their own keyword arguments."""
        return self.template_cls(model=model, criterion=nn.CrossEntropyLoss(), **common, **self.template_kwargs())

    def template_kwargs(self) -> dict:
        """The Config fields beyond :class:`TrainConfig`'s, passed to the template under the same names."""
        shared = {f.name for f in dataclasses.fields(TrainConfig)}
        return {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)
                if f.name not in shared}

    def train(self, experience) -> None:
        # Avalanche 0.6 warns about its own deprecated storage-policy calls and resets the warning filters to do
        # so; record the warnings and re-emit all others.
        with warnings.catch_warnings(record=True) as caught:
            self.template.train(experience, num_workers=0)
        for w in caught:
            if not issubclass(w.category, DeprecationWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        model = self.template.model
        model.eval()
        t = task_labels if task_labels is not None else torch.zeros(len(x), dtype=torch.long, device=x.device)
        return avalanche_forward(model, x, t)

    def num_parameters(self) -> ParamCount:
        return ParamCount.of(self.template.model)


@STRATEGIES.register("naive")
class NaiveStrategy(AvalancheStrategy):
    """Fine-tuning on each experience in turn: the lower bound."""

    template_cls = Naive
    private = True                         # each training call uses its own data, the loss is a batch mean (dp)


@STRATEGIES.register("cumulative")
class CumulativeStrategy(AvalancheStrategy):
    """Retrains on all data seen so far at every step: the per-step upper bound."""

    template_cls = Cumulative


@STRATEGIES.register("joint")
class JointStrategy(AvalancheStrategy):
    """One offline training on the union of all experiences; evaluated once (only ``last_acc`` is defined)."""

    offline = True
    template_cls = JointTraining


@dataclass
class MemoryConfig(TrainConfig):
    mem_size: int = 2000


@STRATEGIES.register("replay")
class ReplayStrategy(AvalancheStrategy):
    """Experience replay with a class-balanced reservoir memory of ``mem_size`` samples (Avalanche's Replay)."""

    template_cls = Replay
    Config = MemoryConfig


@dataclass
class EWCConfig(TrainConfig):
    ewc_lambda: float = 100.0
    mode: str = setting("separate", choices=("separate", "online"))
    decay_factor: float | None = setting(None, within=Range(0, 1, open_low=True), only_with=only_with("mode", "online"))
    #                                     online mode: the importance matrices' decay (Avalanche requires one)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "online" and self.decay_factor is None:
            raise ValueError("mode online needs decay_factor (the importance decay in (0, 1], e.g. 0.9).")


class AugmentedFisherEWCPlugin(EWCPlugin):
    """Avalanche's EWC plugin whose Fisher pass over the experience's training data (after the experience) reads
    its batches through the scenario's batch augmentation (:func:`augmented_loaders`), as it read them through the
    dataset's per-sample train transform before."""

    def after_training_exp(self, strategy, **kwargs):
        with augmented_loaders(strategy, avalanche_ewc):
            super().after_training_exp(strategy, **kwargs)


class AugmentedFisherEWC(EWC):
    """Avalanche's EWC template (``separate`` and ``online`` modes) with :class:`AugmentedFisherEWCPlugin`."""

    def __init__(self, *args, **kwargs) -> None:
        with mock.patch.object(strategy_wrappers, "EWCPlugin", AugmentedFisherEWCPlugin):
            super().__init__(*args, **kwargs)


@STRATEGIES.register("ewc")
class EWCStrategy(AvalancheStrategy):
    """Elastic weight consolidation: ``L + lambda/2 sum_i F_i (theta_i - theta*_i)^2`` (Kirkpatrick et al.).

    The Fisher pass over the experience's training data sees the scenario's batch augmentation once
    (:class:`AugmentedFisherEWCPlugin`).
    """

    template_cls = AugmentedFisherEWC
    Config = EWCConfig


@dataclass
class LwFConfig(TrainConfig):
    alpha: float | list[float] = setting(1.0, within=NON_NEGATIVE)   # a list gives one alpha per experience
    temperature: float = setting(2.0, within=POSITIVE)


@STRATEGIES.register("lwf")
class LwFStrategy(AvalancheStrategy):
    """Learning without forgetting: distillation of the previous model's outputs on old classes (Li & Hoiem)."""

    template_cls = LwF
    Config = LwFConfig


@dataclass
class ICaRLConfig(TrainConfig):
    mem_size: int = 2000
    fixed_memory: bool = True
    epochs: int = 70
    batch_size: int = 128
    lr: float = 2.0
    momentum: float = setting(0.0, only_with=SGD_ONLY)
    weight_decay: float = 1e-5


class Float32ICaRLLoss(ICaRLLossPlugin):
    """Avalanche's iCaRL loss ``BCE(σ(z), t)`` (``t_c = σ(z_old)_c`` on the old classes, ``1[c = y]`` on the others)
    computed in float32 with autocast off (:func:`clbench.precision.in_float32`): under ``--amp`` CUDA autocast
    refuses ``binary_cross_entropy`` and the bf16 ``σ(z_old)`` cannot be written into the float32 target."""

    def __call__(self, logits: Tensor, targets: Tensor) -> Tensor:
        if self.old_logits is not None:
            self.old_logits = self.old_logits.float()
        return in_float32(super().__call__, logits, targets)


@STRATEGIES.register("icarl")
class ICaRLStrategy(AvalancheStrategy):
    """iCaRL: herding exemplars, BCE + distillation, nearest-mean-of-exemplars classification (Rebuffi et al.).

    Exemplars are trained with the scenario's augmentation, once per forward, as the new data are: the authors'
    code concatenates the stored exemplars to the new classes' training data and draws every minibatch of it with
    random crops and flips (github.com/srebuffi/iCaRL, ``iCaRL-TheanoLasagne/main_cifar_100_theano.py``:
    ``X_train = np.concatenate((X_train, X_protoset))``, then ``iterate_minibatches(X_train, Y_train, batch_size,
    shuffle=True, augment=True)``), and Avalanche's ICaRL examples pass the train transform as ``buffer_transform``.
    Here the exemplars are stored untransformed and joined to the experience's data (``buffer_transform=None``: no
    scenario has a per-sample train transform), and the bridge's batch augmentation augments each minibatch, its
    exemplars included (``tests/test_strategies_baselines.py`` checks once). Herding and the class means read the
    untransformed samples in eval mode.
    """

    template_cls = ICaRL
    head = "fixed"
    Config = ICaRLConfig
    PRESETS = {"cpu": CPU, "full": {}}

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        if self.info.domain_incremental or self.info.task_aware:
            raise ValueError(f"icarl is a class-incremental method; scenario {self.info.name!r} is "
                             f"{'domain' if self.info.domain_incremental else 'task'}-incremental. "
                             f"Use it on a class-incremental scenario (e.g. mnist_fmnist with mode=class).")
        with mock.patch.object(avalanche_icarl, "ICaRLLossPlugin", Float32ICaRLLoss):
            return ICaRL(feature_extractor=model.feature_extractor, classifier=model.classifier,
                         memory_size=self.config.mem_size, buffer_transform=None,
                         fixed_memory=self.config.fixed_memory, **common)


@dataclass
class DarkERConfig(TrainConfig):
    mem_size: int = 2000
    batch_size_mem: int | None = setting(None, within=AT_LEAST_1)    # None: batch_size
    alpha: float = setting(0.1, within=NON_NEGATIVE)                 # logit-matching weight
    beta: float = setting(0.5, within=NON_NEGATIVE)                  # CE on the memory (DER++ when > 0)


class AugmentedReplayDER(DER):
    """Avalanche's DER whose replay batch goes through the scenario's batch augmentation (:func:`augmented_buffer`):
    DER joins it to the minibatch in ``_before_forward``, after the bridge augmented the minibatch. The stored logits
    are the buffer's, as computed when stored (on the untransformed samples, in eval mode)."""

    def _before_training_exp(self, **kwargs):
        super()._before_training_exp(**kwargs)
        self.replay_loader = augmented_buffer(self, self.replay_loader)


@STRATEGIES.register("der_dark")
class DarkExperienceReplayStrategy(AvalancheStrategy):
    """Dark experience replay: ``CE + alpha ||z_mem - z_stored||^2 (+ beta CE on memory = DER++)``
    (Buzzega et al., 2020). Needs a fixed-width head (stored logits keep their width)."""

    template_cls = AugmentedReplayDER
    head = "fixed"
    Config = DarkERConfig
    # DER++'s own setting (Buzzega et al., 2020, CIFAR: SGD lr 0.03 without momentum, batch 32, 50 epochs): the
    # shared FULL (SGD 0.1, momentum 0.9, wd 5e-4) diverges from the second step on (seen to NaN on CPU and an H200).
    # Where it stands: the authors' repository aimagelab/mammoth, utils/best_args.py, "seq-cifar10" / "derpp" at
    # buffer 500: lr 0.03, batch_size 32, minibatch_size 32, n_epochs 50 (alpha 0.2, beta 0.5 there; this Config
    # keeps alpha 0.1, beta 0.5). The paper has no CIFAR-100 row: these are its Seq-CIFAR-10 values.
    PRESETS: ClassVar[dict[str, dict]] = {"cpu": CPU, "full": {"epochs": 50, "batch_size": 32, "optimizer": "sgd",
                                                               "lr": 0.03, "momentum": 0.0, "weight_decay": 0.0}}


@STRATEGIES.register("gdumb")
class GDumbStrategy(AvalancheStrategy):
    """GDumb: a greedy class-balanced memory; the model is trained on the memory only (Prabhu et al., 2020)."""

    template_cls = GDumb
    Config = MemoryConfig
