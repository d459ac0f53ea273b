"""Training phases and the balanced fine-tuning phase of dynamic-expansion methods (DyTox, DER).

A :class:`Phase` describes one training pass over an experience: epochs, learning-rate schedule, and what is
trained on what. DyTox and DER train each task ``t`` in a task phase on ``D_t ∪ M``, then, for ``t > 0``, run a
balanced fine-tuning phase (:func:`balanced_finetuning`): only the class-balanced memory ``M``, the feature
extractor frozen, a small constant learning rate, for a few epochs, so that the classifier's bias towards the new
classes (which dominate ``D_t ∪ M``) is corrected.

:class:`clbench.cl.template.PhasedTemplate` runs phases through Avalanche's ``SupervisedTemplate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from clbench.training import step_decay


@dataclass(frozen=True)
class Phase:
    """One training pass over an experience.

    The per-epoch learning rate (:meth:`lr_at`) is timm's: a linear warm-up from ``warmup_lr`` over
    ``warmup_epochs``, then constant ``lr`` or, with ``cosine``, ``min_lr + ½(lr - min_lr)(1 + cos(π e / E))``;
    ``milestones`` multiply the lr by ``lr_decay`` at each milestone epoch reached (DER's step schedule:
    :func:`clbench.training.step_decay`, as torch's ``MultiStepLR``).
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
            return step_decay(self.lr, epoch, self.milestones, self.lr_decay)
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
