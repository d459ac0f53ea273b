"""Training phases and the balanced fine-tuning phase of dynamic-expansion methods (DyTox, DER).

A :class:`Phase` describes one training pass over an experience: epochs, learning-rate schedule
(:class:`clbench.training.Schedule`), and what is trained on what. DyTox and DER train each task ``t`` in a task
phase on ``D_t ∪ M``, then, for ``t > 0``, run a balanced fine-tuning phase (:func:`balanced_finetuning`): only the
class-balanced memory ``M``, the feature extractor frozen, a small learning rate, for a few epochs, so that the
classifier's bias towards the new classes (which dominate ``D_t ∪ M``) is corrected.

:class:`clbench.cl.template.PhasedTemplate` runs phases through Avalanche's ``SupervisedTemplate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from clbench.training import Schedule


@dataclass(frozen=True)
class Phase:
    """One training pass over an experience: ``epochs`` at the rates of ``schedule`` (the template sets each
    epoch's, or each step's, before it trains; the strategy's optimizer starts at ``schedule.lr``: DyTox's warm-up
    and cosine, DER's warm-up and milestones, PETL's constant rate are all a :class:`~clbench.training.Schedule`).
    ``freeze_extractor`` and ``memory_only`` are applied by :class:`PhasedTemplate`; ``task_losses`` (the task
    phase's losses beyond classification: DyTox's distillation and divergence head, DER's auxiliary head) and
    ``freeze_old_tasks`` (the parameters of earlier tasks) are flags for the strategy's own hooks.
    """

    epochs: int
    schedule: Schedule
    task_losses: bool = False
    freeze_old_tasks: bool = False
    freeze_extractor: bool = False
    memory_only: bool = False

    def lr_at(self, epoch: int) -> float:
        """The learning rate of epoch ``e`` (0-based) of a per-epoch schedule."""
        return self.schedule.lr_at(epoch, self.epochs)


def balanced_finetuning(epochs: int, schedule: Schedule) -> Phase:
    """The balanced fine-tuning phase: memory only, feature extractor frozen, ``epochs`` at the rates of ``schedule``
    (DyTox: a constant rate; DER: milestones)."""
    return Phase(epochs=epochs, schedule=schedule, freeze_extractor=True, memory_only=True)


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
