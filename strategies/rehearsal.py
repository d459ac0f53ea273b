"""Rehearsal strategies of Avalanche 0.6: A-GEM, GEM, ER-ACE, ER-AML, MIR, GSS-greedy, BiC, CoPE, feature replay
and MER.

Each keeps a memory of past samples and uses it in a different way (``L`` = cross-entropy on the mini-batch):

- ``gem``     projects the gradient g onto ``{g̃ : ⟨g̃, g_k⟩ ≥ 0}`` for the gradients g_k of each previous
  experience's memory (a QP; Lopez-Paz & Ranzato, 2017). ``memory_strength`` γ is added to the QP's bound.
- ``agem``    one constraint with the memory's average gradient g_ref: ``g̃ = g - (gᵀg_ref / g_refᵀg_ref) g_ref``
  when ``gᵀg_ref < 0`` (Chaudhry et al., 2019).
- ``er_ace``  asymmetric cross-entropy: the incoming mini-batch is scored among its own classes only, a replayed
  mini-batch among all (Caccia et al., 2022).
- ``er_aml``  the incoming mini-batch trained by a supervised-contrastive loss against positives/negatives from the
  memory, the replayed mini-batch by cross-entropy (Caccia et al., 2022).
- ``mir``     replays the ``batch_size_mem`` memory samples (of a random ``subsample``) whose loss would rise most
  after a virtual SGD step on the incoming mini-batch (Aljundi et al., 2019), with clbench's fix of Avalanche's
  buffer (:class:`~clbench.strategies.avalanche_plugins.OfflineMIRPlugin`).
- ``gss``     fills the memory greedily with samples whose gradients are least similar (cosine) to the gradients of
  ``mem_strength`` random memory subsets (Aljundi et al., 2019, "Gradient based sample selection").
- ``bic``     replay + distillation ``(1 - λ) L + λ L_kd`` (λ = old / all classes), then a two-parameter bias layer
  ``α z + β`` on the previous experience's classes fitted on a held-out part of the memory (Wu et al., 2019).
- ``cope``    an L2-normalized embedding trained with the pseudo-prototypical proxy loss against class prototypes
  updated by momentum ``α``; nearest-prototype prediction (De Lange & Tuytelaars, 2021), with clbench's fix of
  Avalanche's plugin (:class:`~clbench.strategies.avalanche_plugins.OfflineCoPEPlugin`).
- ``feature_replay``  stores penultimate features (not images) after each experience; the mini-batch loss is
  ``½ L_new + ½ ((1 - w) CE(clf(f_mem)) + w CE(clf(f_new)))``, ``L_new`` the cross-entropy among the current
  experience's classes (the only term that trains the backbone), w = 1 / (experiences seen) (PR-ACE, Magistri et
  al., openreview 7D9X2cFnt1, as cited by Avalanche). Avalanche's docstring describes this current-classes mask but
  its default criterion masks all seen classes; clbench passes ``MaskedCrossEntropy(mask="new")`` (measured,
  2 epochs, seed 0, last-step average accuracy: 0.665 with "new", 0.164 with "seen" on split digits; 0.277 and
  0.190 on split MNIST, 500 per class).
- ``mer``     meta-experience replay: per-sample SGD steps on the mini-batch plus a memory batch, pulled back by
  Reptile's within-batch (β) and across-batch (γ) interpolations (Riemer et al., 2019); Avalanche's template with
  each inner step firing the callbacks' hooks (:class:`~clbench.strategies.avalanche_plugins.HookedMER`).

Defaults, the paper's setting (as run by ContinualAI's ``continual-learning-baselines`` reproductions where named):
GEM 256 memories per experience (5,120 for 20 CIFAR-100 tasks), γ = 0.5; A-GEM 250 per experience, reference batch
256 (reproduction, permuted MNIST); ER-ACE and ER-AML replay batch 10, memory 1000 (reproductions, split CIFAR-10),
ER-AML temperature 0.1, base temperature 0.07; MIR memory 500, subsample 50, replay batch 10 (reproduction, split
MNIST); GSS memory 300, ``mem_strength`` 10 (reproduction, split MNIST); BiC memory 2000 (CIFAR-100), 10 % of it
held out for the bias layer, T = 2, λ adaptive, stage-2 SGD lr 0.1 for 200 epochs (Avalanche's defaults); CoPE
memory 2000, α = 0.99, T = 0.1, 32-d embedding (reproduction, split MNIST); feature replay memory 200, replay
batch 10 and MER memory 200, replay batch 10, 5 inner steps, β = γ = 0.1 (Avalanche's defaults). Avalanche's own
defaults, where they differ (clbench takes the values above): A-GEM reference batch 64, ER-ACE/ER-AML memory 200,
MIR subsample 200, GSS memory 200 and ``mem_strength`` 1, BiC memory 200 (its plugin: 2000), CoPE memory 200 and
100-d prototypes. The training settings are
:class:`~clbench.strategies.baselines.TrainConfig`'s and the shared ``cpu``/``full`` presets (the online papers use
batch 10 and one epoch). Suites give every method the same memory: GEM/A-GEM as ``patterns_per_exp`` per experience.

Memory samples and the scenario's batch augmentation (:func:`~clbench.strategies.baselines.augmented_buffer`): the
samples each method forwards in training outside the bridged minibatch go through it where the dataset's per-sample
train transform acted on them before: ER-ACE's and ER-AML's replay batches and ER-AML's positives/negatives, A-GEM's
reference batch, MIR's candidates, MER's memory batch, BiC's held-out samples in its bias-layer training (each drawn
batch augmented afresh), and GEM's memory once, when stored (GEM stored the tensors its train-transformed data loader
gave). Feature replay's stored features are not images; they are computed from the experience's training data
through the augmentation, once, as they were through the per-sample transform
(:func:`~clbench.strategies.baselines.augmented_loaders`). GSS stores the minibatch rows before the augmentation,
which the bridge then applies once to each replayed row
(:class:`~clbench.strategies.avalanche_plugins.CleanGradientGSSPlugin`).
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

import torch
from avalanche.training import AGEM, ER_ACE, ER_AML, GEM, FeatureReplay
from avalanche.training.losses import MaskedCrossEntropy
from avalanche.training.plugins import AGEMPlugin, BiCPlugin, GEMPlugin, SupervisedPlugin
from avalanche.training.supervised import strategy_wrappers
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from clbench.registry import STRATEGIES
from clbench.strategies.avalanche_plugins import (
    CleanGradientGSSPlugin,
    CorrectedBiCPlugin,
    HookedMER,
    OfflineCoPEPlugin,
    OfflineMIRPlugin,
    PluginStrategy,
    require_single_head,
)
from clbench.strategies.baselines import (
    AvalancheStrategy,
    TrainConfig,
    augmented_buffer,
    augmented_loaders,
    train_augment,
)
from clbench.typecheck import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, setting


@dataclass
class GEMConfig(TrainConfig):
    patterns_per_exp: int = setting(256, within=AT_LEAST_1)
    memory_strength: float = setting(0.5, within=NON_NEGATIVE)   # γ


class AugmentedMemoryGEMPlugin(GEMPlugin):
    """Avalanche's GEM plugin whose memory of each experience, stored as tensors, goes through the scenario's batch
    augmentation once when stored (:func:`~clbench.strategies.baselines.train_augment`), as the train transform of
    the data loader it is stored from acted on it before."""

    def after_training_exp(self, strategy, **kwargs):
        super().after_training_exp(strategy, **kwargs)
        augment, t = train_augment(strategy), strategy.clock.train_exp_counter
        if augment is not None and t in self.memory_x:
            self.memory_x[t] = augment(self.memory_x[t])


@STRATEGIES.register("gem")
class GEMStrategy(AvalancheStrategy):
    """Gradient episodic memory: the gradient projected so no previous experience's memory loss rises (QP)."""

    template_cls = GEM
    Config = GEMConfig

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        with mock.patch.object(strategy_wrappers, "GEMPlugin", AugmentedMemoryGEMPlugin):
            return super().make_template(model, common)


@dataclass
class AGEMConfig(TrainConfig):
    patterns_per_exp: int = setting(250, within=AT_LEAST_1)
    sample_size: int = 256               # memory samples in the reference gradient


class AugmentedMemoryAGEMPlugin(AGEMPlugin):
    """Avalanche's A-GEM plugin whose reference batches (drawn from the memory before each training iteration) go
    through the scenario's batch augmentation (:func:`~clbench.strategies.baselines.augmented_buffer`)."""

    def after_training_exp(self, strategy, **kwargs):
        super().after_training_exp(strategy, **kwargs)
        self.buffer_dliter = augmented_buffer(strategy, self.buffer_dliter)


@STRATEGIES.register("agem")
class AGEMStrategy(AvalancheStrategy):
    """Averaged GEM: one projection against the gradient of a random memory batch (Chaudhry et al., 2019)."""

    template_cls = AGEM
    Config = AGEMConfig

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        with mock.patch.object(strategy_wrappers, "AGEMPlugin", AugmentedMemoryAGEMPlugin):
            return super().make_template(model, common)


@dataclass
class ERConfig(TrainConfig):
    mem_size: int = 1000
    batch_size_mem: int = setting(10, within=AT_LEAST_1)


class AugmentedReplayER_ACE(ER_ACE):  # noqa: N801  (Avalanche's name)
    """Avalanche's ER-ACE whose replay batch (forwarded apart from the minibatch) goes through the scenario's batch
    augmentation (:func:`~clbench.strategies.baselines.augmented_buffer`)."""

    def _before_training_exp(self, **kwargs):
        super()._before_training_exp(**kwargs)
        self.replay_loader = augmented_buffer(self, self.replay_loader)


class AugmentedReplayER_AML(ER_AML):  # noqa: N801  (Avalanche's name)
    """Avalanche's ER-AML whose replay batch and per-class positive/negative batches (forwarded apart from the
    minibatch) go through the scenario's batch augmentation (:func:`~clbench.strategies.baselines.augmented_buffer`)."""

    def _before_training_exp(self, **kwargs):
        super()._before_training_exp(**kwargs)
        if self.replay_loader is not None:
            self.replay_loader = augmented_buffer(self, self.replay_loader)
            self.pos_neg_loaders = [augmented_buffer(self, loader) for loader in self.pos_neg_loaders]


@STRATEGIES.register("er_ace")
class ERACEStrategy(AvalancheStrategy):
    """ER with asymmetric cross-entropy: new samples compete only among their own classes (Caccia et al., 2022)."""

    template_cls = AugmentedReplayER_ACE
    Config = ERConfig


@dataclass
class ERAMLConfig(ERConfig):
    temp: float = setting(0.1, within=POSITIVE)
    base_temp: float = setting(0.07, within=POSITIVE)
    same_task_neg: bool = True


@STRATEGIES.register("er_aml")
class ERAMLStrategy(AvalancheStrategy):
    """ER with asymmetric metric learning: contrastive loss on new samples, CE on replay (Caccia et al., 2022)."""

    template_cls = AugmentedReplayER_AML
    Config = ERAMLConfig

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        # Avalanche's ER_AML draws positives/negatives from per-class buffers with drop_last batches of
        # `batch_size`: a class holding fewer samples yields no batch and its endless `cycle` never returns.
        per_class = self.config.mem_size // self.info.n_classes
        if per_class < self.config.batch_size:
            raise ValueError(f"er_aml needs mem_size // n_classes >= batch_size (Avalanche's ER_AML hangs "
                             f"otherwise): {self.config.mem_size} // {self.info.n_classes} = {per_class} < "
                             f"{self.config.batch_size}; raise mem_size or lower batch_size.")
        return AugmentedReplayER_AML(model=model, feature_extractor=model.feature_extractor,
                                     criterion=nn.CrossEntropyLoss(), **common, **self.template_kwargs())


@dataclass
class MIRConfig(TrainConfig):
    mem_size: int = 500
    subsample: int = setting(50, within=AT_LEAST_1)
    batch_size_mem: int = setting(10, within=AT_LEAST_1)


@STRATEGIES.register("mir")
class MIRStrategy(PluginStrategy):
    """Maximally interfered retrieval: replay the samples a virtual step would hurt most (Aljundi et al., 2019)."""

    plugin_cls = OfflineMIRPlugin
    Config = MIRConfig


@dataclass
class GSSConfig(TrainConfig):
    mem_size: int = 300
    mem_strength: int = setting(10, within=AT_LEAST_1)   # random memory subsets the candidate gradients meet


@STRATEGIES.register("gss")
class GSSStrategy(PluginStrategy):
    """Greedy gradient-based sample selection: keep the samples with the most diverse gradients (Aljundi et al.)."""

    Config = GSSConfig

    def plugin(self) -> SupervisedPlugin:
        require_single_head("gss", self.info)
        return CleanGradientGSSPlugin(input_size=list(self.info.input_shape), **self.template_kwargs())


@dataclass
class BiCConfig(TrainConfig):
    mem_size: int = 2000
    val_percentage: float = setting(0.1, within=Range(0, 1, open_low=True, open_high=True))   # share of the
    #                                      memory held out to fit the bias layer
    T: float = setting(2.0, within=POSITIVE)   # distillation temperature
    stage_2_epochs: int = 200
    lamb: float = setting(-1.0, within=Range(-1))   # -1: λ = old classes / all classes; else the KD weight
    bias_lr: float = 0.1                 # SGD lr of the bias layer (stage 2)


@STRATEGIES.register("bic")
class BiCStrategy(PluginStrategy):
    """Bias correction: replay + distillation, then a bias layer on the newest old classes (Wu et al., 2019)."""

    Config = BiCConfig

    def plugin(self) -> SupervisedPlugin:
        require_single_head("bic", self.info)
        kwargs = self.template_kwargs()
        return CorrectedBiCPlugin(lr=kwargs.pop("bias_lr"), **kwargs)

    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        """Logits through the bias layer, as Avalanche's ``after_eval_forward`` applies it."""
        plugin = next(p for p in self.template.plugins if isinstance(p, BiCPlugin))
        logits = super().predict(x, task_labels)
        return logits if plugin.is_first_experience else plugin.bias_forward(logits)


@dataclass
class CoPEConfig(TrainConfig):
    mem_size: int = 2000
    p_size: int = 32                     # embedding (prototype) width: the output layer replaces the classifier
    alpha: float = setting(0.99, within=NON_NEGATIVE)   # prototype momentum
    T: float = setting(0.1, within=POSITIVE)            # PPP-loss temperature


@STRATEGIES.register("cope")
class CoPEStrategy(PluginStrategy):
    """Continual prototype evolution: nearest-prototype classifier, PPP loss (De Lange & Tuytelaars, 2021)."""

    Config = CoPEConfig
    head = "fixed"                       # replaced by the embedding layer

    def plugin(self) -> SupervisedPlugin:
        return OfflineCoPEPlugin(n_classes=self.info.n_classes, **self.template_kwargs())

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        require_single_head("cope", self.info)
        model.classifier = nn.Linear(model.feature_extractor.out_features, self.config.p_size)
        return super().make_template(model, common)

    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        """Dot products of the normalized embedding with each seen class's prototype: ``(B, classes seen)``."""
        plugin = next(p for p in self.template.plugins if isinstance(p, OfflineCoPEPlugin))
        return plugin.similarities(super().predict(x, task_labels))


@dataclass
class FeatureReplayConfig(TrainConfig):
    mem_size: int = 200
    batch_size_mem: int = setting(10, within=AT_LEAST_1)


class AugmentedFeatureReplay(FeatureReplay):
    """Avalanche's feature replay whose stored features are computed (after each experience, backbone in eval mode)
    from the experience's training data through the scenario's batch augmentation, once
    (:func:`~clbench.strategies.baselines.augmented_loaders`), as they were through the dataset's per-sample train
    transform."""

    def gather_feature_dataset(self):
        with augmented_loaders(self, torch.utils.data):
            return super().gather_feature_dataset()


@STRATEGIES.register("feature_replay")
class FeatureReplayStrategy(AvalancheStrategy):
    """Feature replay (PR-ACE): stored penultimate features train the classifier (Magistri et al.)."""

    template_cls = AugmentedFeatureReplay
    Config = FeatureReplayConfig

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        require_single_head("feature_replay", self.info)
        return AugmentedFeatureReplay(model=model, criterion=MaskedCrossEntropy(mask="new"),
                             last_layer_name="classifier", **common, **self.template_kwargs())


@dataclass
class MERConfig(TrainConfig):
    mem_size: int = 200
    batch_size_mem: int = setting(10, within=AT_LEAST_1)
    n_inner_steps: int = 5
    beta: float = setting(0.1, within=NON_NEGATIVE)    # within-batch Reptile interpolation
    gamma: float = setting(0.1, within=NON_NEGATIVE)   # across-batch Reptile interpolation


@STRATEGIES.register("mer")
class MERStrategy(AvalancheStrategy):
    """Meta-experience replay: Reptile-interpolated per-sample SGD on new + memory samples (Riemer et al., 2019)."""

    template_cls = HookedMER
    Config = MERConfig
