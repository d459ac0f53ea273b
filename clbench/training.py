"""The one training loop for strategies that are not Avalanche templates, and the optimizers every loop builds from.

:func:`fit` minimizes an objective over shuffled minibatches of in-memory tensors and fires the
:mod:`clbench.callbacks` hooks (``on_batch_start``, ``after_forward`` — which also fails the run on a non-finite
loss —, ``after_backward``, ``after_step``), exactly as :class:`~clbench.callbacks.CallbackPlugin` does inside an
Avalanche template. Tangent members, NLFT, pretraining (:func:`fit_dataset`, over a dataset with per-sample
augmentation) and future non-template strategies train through it.

:func:`step_decay` is the one step schedule (lr drops at each milestone epoch, as torch's ``MultiStepLR``), used
here and by :class:`clbench.cl.Phase`.

:data:`OPTIMIZERS` is the one table of optimizers (``sgd``, ``adam``, ``adamw``) for both kinds of loop:
``OPTIMIZERS.get(name)(params, lr=..., weight_decay=..., momentum=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, default_collate

from clbench.callbacks import BatchPlan, CallbackList
from clbench.registry import Registry

OPTIMIZERS: Registry = Registry("optimizer")

StepScheduler = Callable[[torch.optim.Optimizer, int], torch.optim.lr_scheduler.LRScheduler]
"""``scheduler(optimizer, total_steps)`` -> a torch scheduler stepped after every optimizer step."""


def step_decay(lr: float, epoch: int, milestones: Iterable[int], decay: float) -> float:
    """The step schedule of every loop: ``lr_e = lr · decay^{|{m ∈ milestones : m ≤ e}|}`` for 0-based epoch ``e``.

    The rate drops AT each milestone epoch, as torch's ``MultiStepLR`` stepped once per epoch (and Avalanche's
    ``LRSchedulerPlugin`` around it) does: milestone 30 trains epochs 0-29 at ``lr`` and epoch 30 on at
    ``lr·decay``. A recipe written "decay after epoch k" (0-based, ``k < e``; the official TAFT code's ``step``
    schedule) is milestone ``k + 1``."""
    return lr * decay ** sum(m <= epoch for m in milestones)


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
    """``epochs`` over minibatches of ``batch_size``; per-epoch step schedule :func:`step_decay` ``lr_e = lr ·
    lr_decay^{|{m ∈ lr_milestones : m ≤ e}|}`` for 0-based epoch ``e`` (no milestones: constant lr).
    With ``warmup = w`` instead, the rate changes every step (:meth:`lr_at_step`): a linear warm-up over the first
    ``W = ⌈w·T⌉`` of the ``T = epochs·⌈n/batch_size⌉`` steps, then a linear decay to 0 (Ding et al.'s recipe)."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adam"
    weight_decay: float = 0.0
    lr_milestones: tuple[int, ...] = ()
    lr_decay: float = 0.1
    momentum: float = 0.9
    warmup: float | None = None

    def __post_init__(self) -> None:
        if self.warmup is not None and (not 0 <= self.warmup < 1 or self.lr_milestones):
            raise ValueError(f"warmup (a fraction of the steps in [0, 1)) replaces lr_milestones; got warmup "
                             f"{self.warmup} with milestones {self.lr_milestones}.")

    def lr_at(self, epoch: int) -> float:
        return step_decay(self.lr, epoch, self.lr_milestones, self.lr_decay)

    def lr_at_step(self, step: int, total: int) -> float:
        """Warm-up then linear decay, 0-based ``step`` of ``total``: ``lr·(s+1)/W`` for ``s < W = ⌈w·T⌉``, then
        ``lr·(T−s)/(T−W)``."""
        warm = math.ceil(self.warmup * total)
        return self.lr * ((step + 1) / warm if step < warm else (total - step) / (total - warm))

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
    generator = torch.Generator().manual_seed(seed)

    def epoch_batches(plan: BatchPlan | None, epoch: int) -> Iterator[tuple[Tensor, Tensor]]:
        order = plan(generator) if plan is not None else \
            torch.randperm(len(targets), generator=generator).split(settings.batch_size)
        for batch in order:
            batch = batch.to(inputs.device)
            yield inputs[batch], targets[batch]

    return _loop(model, forward, params, len(targets), epoch_batches, objective, settings, callbacks)


def fit_dataset(model: nn.Module, forward: Callable[[Tensor], Tensor], params: Iterable[nn.Parameter],
                dataset: Dataset, objective: Callable[[Tensor, Tensor], Tensor], settings: FitSettings, seed: int,
                callbacks: CallbackList | None = None, scheduler: StepScheduler | None = None) -> int:
    """:func:`fit` over a map-style ``dataset`` of ``(x, y, *rest)`` samples whose transforms run per sample (a
    scenario's train augmentation, drawn from the global RNG): epoch ``e`` is a ``DataLoader`` shuffled by a generator
    seeded ``seed + e`` (or the callbacks' batch plan, drawn from that generator). ``scheduler(optimizer, T)``, if
    given, builds a torch scheduler stepped after each of the ``T = epochs·⌈n/batch_size⌉`` optimizer steps, in
    place of ``settings``' per-epoch schedule (e.g. ``OneCycleLR``); it needs the loop's fixed-size minibatches."""

    def epoch_batches(plan: BatchPlan | None, epoch: int) -> Iterator[tuple[Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed + epoch)
        if plan is None:
            loader = DataLoader(dataset, batch_size=settings.batch_size, shuffle=True, generator=generator)
        else:
            loader = ([dataset[i] for i in batch.tolist()] for batch in plan(generator))
            loader = (default_collate(samples) for samples in loader)
        for x, y, *_ in loader:
            yield x, y

    return _loop(model, forward, params, len(dataset), epoch_batches, objective, settings, callbacks, scheduler)


def _loop(model: nn.Module, forward: Callable[[Tensor], Tensor], params: Iterable[nn.Parameter], n: int,
          epoch_batches: Callable[[BatchPlan | None, int], Iterable[tuple[Tensor, Tensor]]],
          objective: Callable[[Tensor, Tensor], Tensor], settings: FitSettings, callbacks: CallbackList | None,
          scheduler: StepScheduler | None = None) -> int:
    """The loop of :func:`fit` and :func:`fit_dataset`: ``epoch_batches(plan, epoch)`` yields the minibatches
    ``(x, y)`` of one epoch over ``n`` samples (``plan``: the callbacks' batch plan, or None)."""
    callbacks = callbacks if callbacks is not None else CallbackList()
    params = list(params)
    optimizer = settings.make_optimizer(params)
    plan = callbacks.batch_sampler(n, settings.batch_size, settings.epochs)
    if scheduler is not None and (plan is not None or settings.warmup is not None):
        raise ValueError("a per-step scheduler needs fixed-size minibatches and no warmup setting; a callback "
                         "(such as dp's Poisson sampling) replaced them, or warmup is set: use one schedule.")
    per_step = scheduler(optimizer, settings.epochs * math.ceil(n / settings.batch_size)) if scheduler else None
    steps = 0
    for epoch in range(settings.epochs):
        if per_step is None:
            for group in optimizer.param_groups:
                group["lr"] = settings.lr_at(epoch)
        for x, y in epoch_batches(plan, epoch):
            if settings.warmup is not None:
                for group in optimizer.param_groups:
                    group["lr"] = settings.lr_at_step(steps, settings.epochs * math.ceil(n / settings.batch_size))
            callbacks.on_batch_start(x, y)
            loss = objective(forward(x), y)
            callbacks.after_forward(loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            callbacks.after_backward(model)
            optimizer.step()
            callbacks.after_step(optimizer)
            if per_step is not None:
                per_step.step()
            steps += 1
        callbacks.on_epoch_end(epoch)
    return steps


__all__ = ["OPTIMIZERS", "FitSettings", "StepScheduler", "fit", "fit_dataset", "step_decay"]
