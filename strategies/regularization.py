"""Regularization strategies of Avalanche 0.6: SI, MAS, RWalk, LFL and EWC's online mode.

Each penalizes change away from the previous experiences' solution; none stores data. With ``L`` the
cross-entropy on the current mini-batch, θ* the parameters after the previous experience and Ω an importance:

- ``si``     ``L + c/2 · Σ Ω (θ - θ*)²``, Ω the path integral of the loss decrease along training (Zenke et al.,
  2017), with clbench's fix of Avalanche's plugin (:class:`~clbench.strategies.avalanche_plugins.
  ClonedSynapticIntelligencePlugin`).
- ``mas``    ``L + λ · Σ Ω (θ - θ*)²``, Ω = mean |∂‖f(x)‖² / ∂θ| over the experience (Aljundi et al., 2018), blended
  with the previous Ω as ``α Ω_old + (1 - α) Ω_new``.
- ``rwalk``  ``L + λ · Σ (F + s) (θ - θ*)²``, F an EWC++ moving-average Fisher, s the path-integral score every
  ``delta_t`` steps, both normalized to [0, 1] (Chaudhry et al., 2018), with clbench's fix of Avalanche's plugin
  for experiences shorter than ``delta_t`` iterations.
- ``lfl``    ``L + λ_e · ‖h(x) - h*(x)‖²`` on the penultimate features h, the last layer frozen after each
  experience (Jung et al., 2016, "Less-forgetting learning in deep neural networks").
- ``ewc_online`` ``L + λ · Σ F̃ (θ - θ*)²`` with one running Fisher ``F̃ = γ F̃_old + F_new`` and θ* the latest
  parameters only (Schwarz et al., 2018), where ``ewc`` keeps one penalty per experience.

Defaults, the paper's setting unless said otherwise (the split-MNIST settings are those of ContinualAI's
``continual-learning-baselines`` reproductions of these papers): SI c = 1, ξ = 1e-3 (Zenke et al., split MNIST;
Avalanche's default ξ is 1e-7, we take the paper's); MAS λ = 1, α = 0.5 (Avalanche's defaults; α follows FACIL);
RWalk λ = 0.1, α = 0.9, Δt = 10 (Avalanche's defaults = the reproduction's split-MNIST setting); LFL λ_e = 1e-4
(the reproduction's permuted-MNIST setting, Avalanche has no default); online EWC λ = 100 as clbench's ``ewc``,
γ = 1 (no decay; Avalanche has no default, Schwarz et al. tune γ ≤ 1). The shared training settings (optimizer,
epochs, batch) are :class:`~clbench.strategies.baselines.TrainConfig`'s and the ``cpu``/``full`` presets.

The scenario's batch augmentation (:mod:`clbench.callbacks`): the importance passes that read data see it once, as
they saw the dataset's per-sample train transform before the image scenarios declared it as a batch augmentation:
MAS's and online EWC's passes over the experience's training data after each experience
(:func:`~clbench.strategies.baselines.augmented_loaders`), RWalk's per-iteration gradient on the training minibatch
(taken on the augmented minibatch, :class:`~clbench.strategies.avalanche_plugins.FiniteRWalkPlugin`).
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

from avalanche.models.base_model import BaseModel
from avalanche.training import LFL, MAS
from avalanche.training.plugins import MASPlugin
from avalanche.training.plugins import mas as avalanche_mas
from avalanche.training.supervised import strategy_wrappers
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from clbench.registry import STRATEGIES
from clbench.strategies.avalanche_plugins import ClonedSynapticIntelligencePlugin, FiniteRWalkPlugin, PluginStrategy
from clbench.strategies.baselines import AugmentedFisherEWC, AvalancheStrategy, TrainConfig, augmented_loaders
from clbench.typecheck import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, setting


@dataclass
class SIConfig(TrainConfig):
    si_lambda: float = 1.0               # c
    eps: float = setting(1e-3, within=POSITIVE)   # ξ, the damping of Ω's denominator


@STRATEGIES.register("si")
class SynapticIntelligenceStrategy(PluginStrategy):
    """Synaptic intelligence: a path-integral importance per weight (Zenke et al., 2017), Avalanche's plugin fixed."""

    plugin_cls = ClonedSynapticIntelligencePlugin
    Config = SIConfig


@dataclass
class MASConfig(TrainConfig):
    lambda_reg: float = setting(1.0, within=NON_NEGATIVE)
    alpha: float = setting(0.5, within=NON_NEGATIVE)   # weight of the previous importance in the running blend


class AugmentedImportanceMASPlugin(MASPlugin):
    """Avalanche's MAS plugin whose importance pass over the experience's training data reads its batches through
    the scenario's batch augmentation (:func:`~clbench.strategies.baselines.augmented_loaders`), as it read them
    through the dataset's per-sample train transform before."""

    def _get_importance(self, strategy):
        with augmented_loaders(strategy, avalanche_mas):
            return super()._get_importance(strategy)


class AugmentedImportanceMAS(MAS):
    """Avalanche's MAS template with :class:`AugmentedImportanceMASPlugin`."""

    def __init__(self, *args, **kwargs) -> None:
        with mock.patch.object(strategy_wrappers, "MASPlugin", AugmentedImportanceMASPlugin):
            super().__init__(*args, **kwargs)


@STRATEGIES.register("mas")
class MASStrategy(AvalancheStrategy):
    """Memory aware synapses: importance = sensitivity of the output norm to each weight (Aljundi et al., 2018)."""

    template_cls = AugmentedImportanceMAS
    Config = MASConfig


@dataclass
class RWalkConfig(TrainConfig):
    ewc_lambda: float = 0.1
    ewc_alpha: float = 0.9               # EWC++ moving-average factor of the Fisher
    delta_t: int = setting(10, within=AT_LEAST_1)      # iterations between path-integral score updates


@STRATEGIES.register("rwalk")
class RWalkStrategy(PluginStrategy):
    """Riemannian walk: EWC++ Fisher + path-integral scores as the penalty weights (Chaudhry et al., 2018)."""

    plugin_cls = FiniteRWalkPlugin
    Config = RWalkConfig


@dataclass
class LFLConfig(TrainConfig):
    lambda_e: float = setting(1e-4, within=NON_NEGATIVE)


class _WithFeatures(nn.Module, BaseModel):
    """A single-head clbench classifier with Avalanche's ``get_features`` (its backbone's output), for LFL."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def get_features(self, x: Tensor) -> Tensor:
        return self.model.feature_extractor(x)


@STRATEGIES.register("lfl")
class LFLStrategy(AvalancheStrategy):
    """Less-forgetful learning: keep the penultimate features close to the previous model's (Jung et al., 2016)."""

    template_cls = LFL
    Config = LFLConfig

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        if self.info.task_aware:
            raise ValueError(f"lfl is wrapped for one shared head; scenario {self.info.name!r} is task-incremental.")
        return super().make_template(_WithFeatures(model), common)


@dataclass
class OnlineEWCConfig(TrainConfig):
    ewc_lambda: float = 100.0
    decay_factor: float = setting(1.0, within=Range(0, 1, open_low=True))   # γ


@STRATEGIES.register("ewc_online")
class OnlineEWCStrategy(AvalancheStrategy):
    """Online EWC: one running Fisher ``γ F_old + F_new`` anchored at the latest weights (Schwarz et al., 2018)."""

    template_cls = AugmentedFisherEWC     # the Fisher pass sees the batch augmentation (module docstring)
    Config = OnlineEWCConfig

    def template_kwargs(self) -> dict:
        return {**super().template_kwargs(), "mode": "online"}
