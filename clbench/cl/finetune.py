"""Training phases and the balanced fine-tuning phase of dynamic-expansion methods (DyTox, DER).

A :class:`Phase` describes one training pass over an experience: epochs, learning-rate schedule, and what is
trained on what. DyTox and DER train each task ``t`` in a task phase on ``D_t ∪ M``, then, for ``t > 0``, run a
balanced fine-tuning phase (:func:`balanced_finetuning`): only the class-balanced memory ``M``, the feature
extractor frozen, a small constant learning rate, for a few epochs, so that the classifier's bias towards the new
classes (which dominate ``D_t ∪ M``) is corrected.

:class:`PhasedTemplate` runs phases through Avalanche's ``SupervisedTemplate`` (mix it in before the template:
``class MyTemplate(PhasedTemplate, SupervisedTemplate)``); the strategy supplies ``self.memory``, ``self.phase``
(the phase to start with) and :meth:`PhasedTemplate.feature_extractor`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from clbench.cl.memory import Memory


@dataclass(frozen=True)
class Phase:
    """One training pass over an experience.

    The per-epoch learning rate (:meth:`lr_at`) is timm's: a linear warm-up from ``warmup_lr`` over
    ``warmup_epochs``, then constant ``lr`` or, with ``cosine``, ``min_lr + ½(lr - min_lr)(1 + cos(π e / E))``;
    ``milestones`` multiply the lr by ``lr_decay`` at each milestone epoch reached (step schedule, DER's).
    ``freeze_extractor`` and ``memory_only`` are applied by :class:`PhasedTemplate`; ``task_losses`` (the task
    phase's losses beyond classification: DyTox's distillation and divergence head, DER's auxiliary head) and
    ``freeze_old_tasks`` (the parameters of earlier tasks) are flags for the strategy's own hooks.
    """

    epochs: int
    lr: float
    warmup_epochs: int = 0
    warmup_lr: float = 0.0
    min_lr: float = 0.0
    cosine: bool = False
    milestones: tuple[int, ...] = ()
    lr_decay: float = 0.1
    task_losses: bool = False
    freeze_old_tasks: bool = False
    freeze_extractor: bool = False
    memory_only: bool = False

    def lr_at(self, epoch: int) -> float:
        """The learning rate of epoch ``e`` (0-based)."""
        if epoch < self.warmup_epochs:
            return self.warmup_lr + epoch * (self.lr - self.warmup_lr) / self.warmup_epochs
        if not self.cosine:
            return self.lr * self.lr_decay ** sum(m <= epoch for m in self.milestones)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * epoch / self.epochs))


def balanced_finetuning(epochs: int, lr: float) -> Phase:
    """The balanced fine-tuning phase: memory only, feature extractor frozen, constant ``lr``, ``epochs``."""
    return Phase(epochs=epochs, lr=lr, freeze_extractor=True, memory_only=True)


def freeze(module: nn.Module) -> Callable[[], None]:
    """Set ``requires_grad = False`` and eval mode (dropout, stochastic depth and BatchNorm statistics off) on
    ``module``; return a function that restores every parameter's flag and every submodule's mode."""
    grads = [(p, p.requires_grad) for p in module.parameters()]
    modes = [(m, m.training) for m in module.modules()]
    module.requires_grad_(False).eval()

    def restore() -> None:
        for p, flag in grads:
            p.requires_grad_(flag)
        for m, mode in modes:
            m.training = mode

    return restore


class PhasedTemplate:
    """Mixin for ``SupervisedTemplate`` that trains one :class:`Phase` per :meth:`run_phase` call.

    - dataset adaptation: ``D_t ∪ M`` (``M = self.memory.dataset()``), or ``M`` alone for a ``memory_only`` phase,
      with train transforms;
    - model adaptation: Avalanche's, then the :meth:`feature_extractor` frozen for a ``freeze_extractor`` phase
      (:func:`freeze`). It stays frozen after the phase (parameter counts taken after the step see the state
      the phase trained in) and is restored when the next phase starts;
    - every epoch: the learning rate of every optimizer group set to ``phase.lr_at(epoch)``.
    """

    phase: Phase
    memory: Memory
    _restore_extractor: Callable[[], None] | None = None

    def feature_extractor(self) -> nn.Module:
        """The module that balanced fine-tuning freezes (DyTox: the encoder; DER: all feature extractors)."""
        raise NotImplementedError(f"{type(self).__name__} must define feature_extractor()")

    def run_phase(self, phase: Phase, experience) -> bool:
        """Train ``phase`` on ``experience``; returns whether it ran. A phase of 0 epochs, and a ``memory_only``
        phase on the first experience or with an empty memory, do not run."""
        skip = phase.memory_only and (experience.current_experience == 0 or len(self.memory) == 0)
        if phase.epochs <= 0 or skip:
            return False
        if self._restore_extractor is not None:
            self._restore_extractor()
            self._restore_extractor = None
        self.phase, self.train_epochs = phase, phase.epochs
        self.train(experience, eval_streams=[])
        return True

    def train_dataset_adaptation(self, **kwargs) -> None:
        memory = self.memory.dataset()
        if self.phase.memory_only:
            data = memory
        else:
            data = self.experience.dataset if memory is None else self.experience.dataset.concat(memory)
        self.adapted_dataset = data.train()

    def model_adaptation(self, model=None):
        model = super().model_adaptation(model)
        if self.is_training and self.phase.freeze_extractor:
            self._restore_extractor = freeze(self.feature_extractor())
        return model

    def _before_training_epoch(self, **kwargs) -> None:
        super()._before_training_epoch(**kwargs)
        lr = self.phase.lr_at(self.clock.train_exp_epochs)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
