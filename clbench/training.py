"""The one training loop for strategies that are not Avalanche templates, the one learning-rate schedule of every
loop, and the optimizers every loop builds from.

:func:`fit` minimizes an objective over shuffled minibatches of in-memory tensors and fires the
:mod:`clbench.callbacks` hooks (``on_batch_start``, ``after_forward`` — which also fails the run on a non-finite
loss —, ``after_backward``, ``after_step``), exactly as :class:`~clbench.callbacks.CallbackPlugin` does inside an
Avalanche template. Tangent members, NLFT, sequence models, pretraining (:func:`fit_dataset`, over a dataset with
per-sample augmentation) and future non-template strategies train through it. :func:`fit_dataset` also applies the
scenario's batch augmentation (``callbacks.augment_batch``: :mod:`clbench.callbacks`) to each minibatch before
``on_batch_start`` and the forward, where the bridge applies it in a template; :func:`fit` (stored tensors, trained
without augmentation) does not. Called without ``callbacks=`` while a
strategy trains in a run (:func:`strategy_training`, entered by the runner around ``strategy.train``), it fires the
strategy's callbacks: a strategy of one's own that forgets to pass them still writes its training log and artifacts,
trains privately when asked and keeps the NaN guard (pass ``callbacks=CallbackList()`` to train an auxiliary model
without them). Outside a run (pretraining, a benchmark) it fires none but the NaN guard.

:class:`Schedule` is the one learning-rate schedule (warm-up, then milestone steps, cosine, linear decay or one
cycle; per epoch or per step). A strategy writes its ``lr`` into a Schedule once; :func:`build_optimizer` starts the
optimizer at it and the loop sets every epoch's or step's rate from it (:meth:`Schedule.apply`): :func:`fit` here,
:class:`clbench.cl.PhasedTemplate` for DyTox, DER and PETL, pretraining through :func:`fit_dataset`.

:data:`OPTIMIZERS` is the one table of optimizers (``sgd``, ``adam``, ``adamw``) for both kinds of loop:
``OPTIMIZERS.get(name)(params, lr=..., weight_decay=..., momentum=...)``, called by :func:`build_optimizer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, default_collate

from clbench.callbacks import BatchPlan, CallbackList
from clbench.registry import Registry

OPTIMIZERS: Registry = Registry("optimizer")

ONE_CYCLE_DIV = (25.0, 1e4)         # one cycle starts at lr / 25 and ends at lr / 25 / 1e4 (torch's OneCycleLR)
ONE_CYCLE_MOMENTUM = (0.85, 0.95)   # β1 (or SGD momentum) from 0.95 down to 0.85 at the peak and back


def _anneal_cos(start: float, end: float, pct: float) -> float:
    """Cosine from ``start`` (``pct = 0``) to ``end`` (``pct = 1``): ``end + (start − end)/2 · (cos(π·pct) + 1)``."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


@dataclass(frozen=True)
class Schedule:
    r"""The learning rate of every optimizer step of one training pass; the strategy gives its ``lr`` here once.

    ``per="epoch"``: one rate per epoch ``e`` of the pass's ``E`` epochs, set before the epoch's first step;
    ``per="step"``: one rate per optimizer step ``s`` of its ``T = E·⌈n/B⌉`` steps, set before the step. With
    ``u`` the epoch or step and ``U`` their number, a warm-up of ``W`` units comes first:

    - per epoch (timm's): ``warmup = W`` whole epochs from ``warmup_lr``, ``lr_e = warmup_lr + e·(lr − warmup_lr)/W``
      (the ramp at the epoch's start: epoch 0 trains at ``warmup_lr``, epoch ``W`` at the full rate);
    - per step (Ding et al.'s): ``warmup = w`` a fraction of the steps, ``W = ⌈w·T⌉``,
      ``lr_s = warmup_lr + (lr − warmup_lr)·(s+1)/W`` (the ramp at the step's end: step ``W−1`` trains at ``lr``).

    then, for ``u ≥ W``, the ``decay``:

    - ``"step"``: ``lr·gamma^{|{m ∈ milestones : m ≤ u}|}``: the rate drops AT each milestone, as torch's
      ``MultiStepLR`` (milestone 30 trains units 0-29 at ``lr``; a recipe's "after epoch k" is milestone ``k + 1``);
      no milestones: constant ``lr``;
    - ``"cosine"``: ``min_lr + ½(lr − min_lr)(1 + cos(π·u/U))`` (timm's, ``u`` counted from the pass's start);
    - ``"linear"``: ``lr·(U − u)/(U − W)``, down to 0 at ``U``;
    - ``"one_cycle"`` (torch's ``OneCycleLR``, per step; it brings its own warm-up): with ``P = w·T − 1``, for
      ``s ≤ P`` a cosine from ``lr/25`` to ``lr`` at ``s/P``, then a cosine from ``lr`` to ``lr/25/10⁴`` at
      ``(s − P)/(T − 1 − P)``; the momentum (Adam's β1, SGD's momentum) cycles inversely, 0.95 → 0.85 → 0.95
      (:meth:`momentum_at`).
    """

    lr: float
    per: str = "epoch"
    warmup: float = 0
    warmup_lr: float = 0.0
    decay: str = "step"
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        problem = (
            f"per is 'epoch' or 'step', got {self.per!r}" if self.per not in ("epoch", "step") else
            f"decay is one of {sorted(DECAYS)}, got {self.decay!r}" if self.decay not in DECAYS else
            f"a per-step warm-up is a fraction of the steps in [0, 1), got {self.warmup}"
            if self.per == "step" and not 0 <= self.warmup < 1 else
            f"a per-epoch warm-up is a whole number of epochs, got {self.warmup}"
            if self.per == "epoch" and (self.warmup < 0 or self.warmup != int(self.warmup)) else
            f"milestones are for decay 'step', not {self.decay!r}" if self.milestones and self.decay != "step" else
            "decay 'one_cycle' is per step (its warm-up is a fraction of the steps)"
            if self.decay == "one_cycle" and self.per != "step" else "")
        if problem:
            raise ValueError(f"Schedule: {problem}.")
        object.__setattr__(self, "milestones", tuple(self.milestones))

    def warmup_units(self, units: int) -> int:
        """``W``: the epochs (per epoch) or steps (per step, ``⌈w·T⌉``) of the linear warm-up."""
        return int(self.warmup) if self.per == "epoch" else math.ceil(self.warmup * units)

    def lr_at(self, unit: int, units: int) -> float:
        """The rate of epoch or step ``unit`` (0-based) of a pass of ``units``."""
        if self.per == "step" and not 0 <= unit < units:
            raise ValueError(f"step {unit} of a pass planned for {units} steps: a per-step schedule needs the "
                             f"loop's ⌈n/batch_size⌉ minibatches per epoch (a callback's batch plan drew more).")
        warm = 0 if self.decay == "one_cycle" else self.warmup_units(units)   # one cycle brings its own warm-up
        if unit >= warm:
            return DECAYS[self.decay](self, unit, units, warm)
        if self.per == "epoch":
            return self.warmup_lr + unit * (self.lr - self.warmup_lr) / warm
        return self.warmup_lr + (self.lr - self.warmup_lr) * ((unit + 1) / warm)

    def momentum_at(self, unit: int, units: int) -> float | None:
        """The momentum of ``unit`` where the schedule cycles it (``one_cycle``), else None (the optimizer's own)."""
        return _one_cycle(self, unit, units)[1] if self.decay == "one_cycle" else None

    def apply(self, optimizer: torch.optim.Optimizer, unit: int, units: int) -> None:
        """Set the rate (and a cycled momentum: β1 of an optimizer with ``betas``, else ``momentum``) of every
        parameter group of ``optimizer`` for ``unit`` of ``units``."""
        lr, momentum = self.lr_at(unit, units), self.momentum_at(unit, units)
        for group in optimizer.param_groups:
            group["lr"] = lr
            if momentum is not None and "betas" in optimizer.defaults:
                group["betas"] = (momentum, *group["betas"][1:])
            elif momentum is not None:
                group["momentum"] = momentum


def _one_cycle(schedule: Schedule, step: int, steps: int) -> tuple[float, float]:
    """``(lr, momentum)`` of ``step`` of ``steps`` under torch's ``OneCycleLR(max_lr=lr, total_steps=steps,
    pct_start=warmup)``, computed as torch computes them (cosine annealing; the peak at the float step
    ``P = warmup·T − 1``)."""
    div, final_div = ONE_CYCLE_DIV
    low, high = ONE_CYCLE_MOMENTUM
    start = schedule.lr / div
    peak = float(schedule.warmup * steps) - 1
    if step <= peak:
        pct = step / peak
        return _anneal_cos(start, schedule.lr, pct), _anneal_cos(high, low, pct)
    pct = (step - peak) / ((steps - 1) - peak)
    return _anneal_cos(schedule.lr, start / final_div, pct), _anneal_cos(low, high, pct)


DECAYS: dict[str, Callable[[Schedule, int, int, int], float]] = {
    "step": lambda s, u, units, warm: s.lr * s.gamma ** sum(m <= u for m in s.milestones),
    "cosine": lambda s, u, units, warm: s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * u / units)),
    "linear": lambda s, u, units, warm: s.lr * ((units - u) / (units - warm)),
    "one_cycle": lambda s, u, units, warm: _one_cycle(s, u, units)[0],
}
"""The decays after the warm-up (:class:`Schedule`): ``(schedule, unit, units, W) -> lr``."""


def build_optimizer(name: str, params: Iterable, schedule: Schedule, weight_decay: float = 0.0,
                    momentum: float = 0.9) -> torch.optim.Optimizer:
    """``OPTIMIZERS.get(name)(params, lr=schedule.lr, ...)``: every loop's optimizer, started at the schedule's
    ``lr``; the loop then sets each epoch's or step's rate with :meth:`Schedule.apply` before it trains.
    ``params``: parameters or parameter groups (a group's own ``weight_decay`` wins over ``weight_decay``)."""
    return OPTIMIZERS.get(name)(params, lr=schedule.lr, weight_decay=weight_decay, momentum=momentum)


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
    """``epochs`` over minibatches of ``batch_size``, the optimizer ``optimizer`` (an :data:`OPTIMIZERS` name) with
    ``weight_decay`` and ``momentum``, its rate from ``schedule`` (a number ``lr`` is the constant ``Schedule(lr)``;
    per step, the pass has ``T = epochs·⌈n/batch_size⌉`` steps)."""

    epochs: int
    batch_size: int
    schedule: Schedule | float
    optimizer: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, Schedule):
            object.__setattr__(self, "schedule", Schedule(float(self.schedule)))

    def make_optimizer(self, params: Iterable) -> torch.optim.Optimizer:
        return build_optimizer(self.optimizer, params, self.schedule, self.weight_decay, self.momentum)


_STRATEGY_CALLBACKS: list[CallbackList] = []      # the callbacks of the strategy training now (innermost last)


@contextmanager
def strategy_training(callbacks: CallbackList) -> Iterator[None]:
    """While inside: :func:`fit` and :func:`fit_dataset` called without ``callbacks=`` fire ``callbacks`` (the
    strategy's, set up by the runner), not an empty list."""
    _STRATEGY_CALLBACKS.append(callbacks)
    try:
        yield
    finally:
        _STRATEGY_CALLBACKS.pop()


def fit(model: nn.Module, forward: Callable[[Tensor], Tensor], params: Iterable[nn.Parameter], inputs: Tensor,
        targets: Tensor, objective: Callable[[Tensor, Tensor], Tensor], settings: FitSettings, seed: int,
        callbacks: CallbackList | None = None) -> int:
    """Minimize ``objective(forward(inputs[b]), targets[b])`` over shuffled minibatches ``b`` (order drawn from
    ``seed``) for ``settings.epochs`` epochs; ``inputs: (M, ...)``, ``targets: (M,)``. ``model`` is the module whose
    gradients ``after_backward`` shows (``forward`` is usually ``model`` or one of its methods). A callback may
    replace the minibatch sampling (``callbacks.batch_sampler``: private training draws Poisson batches from the
    same generator). ``callbacks``: None fires the callbacks of the strategy training now (:func:`strategy_training`;
    none outside a run). Returns the number of optimizer steps."""
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
                callbacks: CallbackList | None = None) -> int:
    """:func:`fit` over a map-style ``dataset`` of ``(x, y, *rest)`` samples whose transforms run per sample (drawn
    from the global RNG): epoch ``e`` is a ``DataLoader`` shuffled by a generator seeded ``seed + e`` (or the
    callbacks' batch plan, drawn from that generator). Each minibatch then goes through
    ``callbacks.augment_batch`` (the scenario's batch augmentation of the strategy's callbacks, drawn from the
    global RNG; none for a ``CallbackList()`` built without one, as pretraining's) before ``on_batch_start``."""

    def epoch_batches(plan: BatchPlan | None, epoch: int) -> Iterator[tuple[Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed + epoch)
        if plan is None:
            loader = DataLoader(dataset, batch_size=settings.batch_size, shuffle=True, generator=generator)
        else:
            loader = ([dataset[i] for i in batch.tolist()] for batch in plan(generator))
            loader = (default_collate(samples) for samples in loader)
        for x, y, *_ in loader:
            yield x, y

    return _loop(model, forward, params, len(dataset), epoch_batches, objective, settings, callbacks, augment=True)


def _loop(model: nn.Module, forward: Callable[[Tensor], Tensor], params: Iterable[nn.Parameter], n: int,
          epoch_batches: Callable[[BatchPlan | None, int], Iterable[tuple[Tensor, Tensor]]],
          objective: Callable[[Tensor, Tensor], Tensor], settings: FitSettings, callbacks: CallbackList | None,
          augment: bool = False) -> int:
    """The loop of :func:`fit` and :func:`fit_dataset`: ``epoch_batches(plan, epoch)`` yields the minibatches
    ``(x, y)`` of one epoch over ``n`` samples (``plan``: the callbacks' batch plan, or None); with ``augment``
    each goes through ``callbacks.augment_batch`` first. The rate comes from
    ``settings.schedule``: set before each epoch or before each of the ``T = epochs·⌈n/batch_size⌉`` steps (a
    callback's batch plan, such as dp's Poisson sampling, draws ⌈n/batch_size⌉ minibatches per epoch too)."""
    if callbacks is None:
        callbacks = _STRATEGY_CALLBACKS[-1] if _STRATEGY_CALLBACKS else CallbackList()
    params = list(params)
    optimizer = settings.make_optimizer(params)
    plan = callbacks.batch_sampler(n, settings.batch_size, settings.epochs)
    schedule, total = settings.schedule, settings.epochs * math.ceil(n / settings.batch_size)
    steps = 0
    for epoch in range(settings.epochs):
        if schedule.per == "epoch":
            schedule.apply(optimizer, epoch, settings.epochs)
        for x, y in epoch_batches(plan, epoch):
            if schedule.per == "step":
                schedule.apply(optimizer, steps, total)
            if augment:
                x = callbacks.augment_batch(x)
            callbacks.on_batch_start(x, y)
            loss = objective(forward(x), y)
            callbacks.after_forward(loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            callbacks.after_backward(model)
            optimizer.step()
            callbacks.after_step(optimizer)
            steps += 1
        callbacks.on_epoch_end(epoch)
    return steps


__all__ = ["DECAYS", "OPTIMIZERS", "FitSettings", "Schedule", "build_optimizer", "fit", "fit_dataset",
           "strategy_training"]
