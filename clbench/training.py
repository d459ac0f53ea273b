"""The one training loop for strategies that are not Avalanche templates, and the optimizers every loop builds from.

:func:`fit` minimizes an objective over shuffled minibatches of in-memory tensors and fires the
:mod:`clbench.callbacks` hooks (``on_batch_start``, ``after_forward`` — which also fails the run on a non-finite
loss —, ``after_backward``, ``after_step``), exactly as :class:`~clbench.callbacks.CallbackPlugin` does inside an
Avalanche template. Tangent members, NLFT and future non-template strategies train through it.

:data:`OPTIMIZERS` is the one table of optimizers (``sgd``, ``adam``, ``adamw``) for both kinds of loop:
``OPTIMIZERS.get(name)(params, lr=..., weight_decay=..., momentum=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from clbench.callbacks import CallbackList
from clbench.registry import Registry

OPTIMIZERS: Registry = Registry("optimizer")


@OPTIMIZERS.register("sgd")
def sgd(params: Iterable, lr: float, weight_decay: float = 0.0, momentum: float = 0.9) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


@OPTIMIZERS.register("adam")
def adam(params: Iterable, lr: float, weight_decay: float = 0.0, momentum: float = 0.9) -> torch.optim.Optimizer:
    """Adam (``momentum`` is unused: β1 stays at torch's 0.9)."""
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


@OPTIMIZERS.register("adamw")
def adamw(params: Iterable, lr: float, weight_decay: float = 0.0, momentum: float = 0.9) -> torch.optim.Optimizer:
    """AdamW (``momentum`` is unused: β1 stays at torch's 0.9)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


@dataclass(frozen=True)
class FitSettings:
    """``epochs`` over minibatches of ``batch_size``; step schedule ``lr_e = lr · lr_decay^{|{m ∈ lr_milestones :
    m < e}|}`` for 0-based epoch ``e`` (the official TAFT code's ``step`` schedule; no milestones: constant lr)."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adam"
    weight_decay: float = 0.0
    lr_milestones: tuple[int, ...] = ()
    lr_decay: float = 0.1
    momentum: float = 0.9

    def lr_at(self, epoch: int) -> float:
        return self.lr * self.lr_decay ** sum(m < epoch for m in self.lr_milestones)

    def make_optimizer(self, params: Iterable) -> torch.optim.Optimizer:
        return OPTIMIZERS.get(self.optimizer)(params, lr=self.lr, weight_decay=self.weight_decay,
                                              momentum=self.momentum)


def fit(model: nn.Module, forward: Callable[[Tensor], Tensor], params: Iterable[nn.Parameter], inputs: Tensor,
        targets: Tensor, objective: Callable[[Tensor, Tensor], Tensor], settings: FitSettings, seed: int,
        callbacks: CallbackList | None = None) -> int:
    """Minimize ``objective(forward(inputs[b]), targets[b])`` over shuffled minibatches ``b`` (order drawn from
    ``seed``) for ``settings.epochs`` epochs; ``inputs: (M, ...)``, ``targets: (M,)``. ``model`` is the module whose
    gradients ``after_backward`` shows (``forward`` is usually ``model`` or one of its methods). A callback may
    replace the minibatch sampling (``callbacks.batch_sampler``: private training draws Poisson batches from the
    same generator). Returns the number of optimizer steps."""
    callbacks = callbacks if callbacks is not None else CallbackList()
    params = list(params)
    optimizer = settings.make_optimizer(params)
    generator = torch.Generator().manual_seed(seed)
    plan = callbacks.batch_sampler(len(targets), settings.batch_size, settings.epochs)
    steps = 0
    for epoch in range(settings.epochs):
        for group in optimizer.param_groups:
            group["lr"] = settings.lr_at(epoch)
        batches = plan(generator) if plan is not None else \
            torch.randperm(len(targets), generator=generator).split(settings.batch_size)
        for batch in batches:
            batch = batch.to(inputs.device)
            x, y = inputs[batch], targets[batch]
            callbacks.on_batch_start(x, y)
            loss = objective(forward(x), y)
            callbacks.after_forward(loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            callbacks.after_backward(model)
            optimizer.step()
            callbacks.after_step(optimizer)
            steps += 1
    return steps


__all__ = ["OPTIMIZERS", "FitSettings", "fit"]
