"""Training hooks fired by every training loop: Avalanche templates (through :class:`CallbackPlugin`), DyTox's
template, and :func:`clbench.training.fit` (tangent members, NLFT and any strategy that is not a template).

A run's hook sequence, whatever the loop::

    on_experience_start(t)                       # fired by the runner around strategy.train(experience t)
        x = augment_batch(x)                     # the scenario's batch augmentation (not a hook: see below)
        on_batch_start(x, y)                     # a minibatch: x (B, ...), y (B,)
        after_forward(loss)                      # the full training loss (scalar), every term added
        after_backward(model)                    # gradients present, before the optimizer step
        after_step(optimizer)                    # parameters updated
        ...                                      # once per minibatch
        on_epoch_end(epoch)                      # after each epoch of a training call (0-based within the call)
        ...                                      # over every epoch and training phase
    on_experience_end(t)
    on_evaluation(evaluation)                    # fired by the runner: row t of every score matrix (Evaluation)
    ...                                          # over every experience
    close()
    on_run_end(metrics)                          # the record's summary metrics (run's own process, finished runs)

Before a training call's first batch (each :func:`~clbench.training.fit` call, each Avalanche experience) the loop
asks ``batch_sampler(n, batch_size, epochs)``: a callback may return a :data:`BatchPlan` that replaces the loop's
shuffled fixed-size minibatches (private training draws Poisson batches); at most one callback may. After the run,
``extra_metrics()`` of every callback joins the record's extra metrics (private training reports ``epsilon``).

**Batch augmentation.** A scenario that declares its train augmentation as a batch augmentation
(:attr:`clbench.protocol.ClassificationInfo.batch_augment`, a :class:`~clbench.augment.CropFlip`: the image
scenarios) has no per-sample train transform; the strategy's :class:`CallbackList` carries it
(``CallbackList(batch_augment=...)``, set by :class:`~clbench.protocol.StrategyBase`) and
:meth:`CallbackList.augment_batch` applies ``batch_augment.batch`` to each training minibatch ONCE, on the batch's
device, just before ``on_batch_start`` and the forward. The one place each loop calls it: the bridge's
``before_training_iteration`` (Avalanche templates: after the data loader's batch, replayed buffer samples of a
replay data loader included, and before the template's own ``_before_forward``, so DyTox's further augmentations
and MixUp come after it as they came after the per-sample crop), and :func:`clbench.training.fit_dataset`
(:func:`~clbench.training.fit` trains on stored tensors without augmentation and does not call it). A strategy
that forwards samples of its own outside the minibatch calls ``self.callbacks.augment_batch`` on them. Evaluation
never augments (it fires none of these). In a template the bridge also keeps the minibatch as the data loader gave
it, before the augmentation (:attr:`CallbackList.unaugmented`): a strategy that stores minibatch rows to replay them
later in its own minibatches (which the bridge augments again; GSS) stores those rows, so that a replayed row
carries one augmentation, as the per-sample transform gave it.

Every :class:`CallbackList` checks the loss first: a non-finite loss raises :class:`~clbench.errors.NonFiniteLossError`
with the same message in every loop, and the run is marked failed.

Callbacks are named in :data:`CALLBACKS` and attached from a suite entry
(``callbacks: [{name: hook_trace, args: {}}]``, validated when the suite loads) or through :func:`clbench.api.run`.
They are re-created from their :class:`CallbackSpec` (name, args) wherever training happens — a shard member in a
spawned process or a Ray task builds its own from the specs carried by its job — and they write files under the
run's artifacts folder ``<out>/artifacts/<run_id>/`` (:attr:`CallbackContext.artifacts`).
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn

from clbench.augment import CropFlip
from clbench.errors import NonFiniteLossError
from clbench.metrics import MetricSpec, summarize_matrix
from clbench.registry import CALLBACKS
from clbench.typecheck import AT_LEAST_1

# clbench scores strategies with its own evaluators: Avalanche templates get an EvaluationPlugin without loggers on
# purpose, and its "No loggers specified" warning would print for every run
warnings.filterwarnings("ignore", message="No loggers specified")

BATCH_HOOKS_FIRED = {"on_batch_start": 0, "augment_batch": 0}
"""Batches started (and batches offered to the batch augmentation) by every :class:`CallbackList` of this process
(:func:`clbench.protocol.hooks_checked` compares the batches started with the optimizer steps taken)."""

C = TypeVar("C", bound="Callback")

BatchPlan = Callable[[torch.Generator], Iterable[Tensor]]
"""``plan(generator)`` -> one epoch of minibatches, each a tensor of sample indices into the training call's data."""


@dataclass(frozen=True)
class CallbackSpec:
    """A callback by name (a :data:`CALLBACKS` entry) and the keyword arguments of its factory; picklable."""

    name: str
    args: dict = field(default_factory=dict)


@dataclass
class CallbackContext:
    """What a callback may reach: the run, its artifacts folder (created on first use by whoever writes), the
    strategy's modules (``modules()`` returns the current ``{name: nn.Module}``; a shard member sees
    ``{"member": model}``), inside a member job the member's key (``""`` for the run's own process), and the
    number of training samples of the whole stream (``n_train``; 0 when unknown)."""

    run_id: str = ""
    artifacts: Path | None = None
    modules: Callable[[], Mapping[str, nn.Module]] = dict
    member: str = ""
    n_train: int = 0


@dataclass(frozen=True)
class Evaluation:
    """The scores after training step ``step`` (0-based; an offline run's single evaluation is step 0), as the runner
    stores them: ``rows[metric]`` is row ``step`` of that metric's matrix ``R`` (``R[step, j]`` for every test
    experience ``j``, stored units: fractions for a ``%`` metric), ``specs`` describe the metrics, ``sizes[j] = n_j``.

    ``summaries`` are the :func:`clbench.metrics.summarize_matrix` columns of the matrix seen so far: for a continual
    run the leading block ``R[:step+1, :step+1]`` (so ``last_acc`` is ``A_step``, the score on the test data of the
    experiences seen so far, ``avg_inc_acc`` the mean of ``A_0..A_step``, ``forgetting`` and ``bwt`` over the
    experiences before ``step``: ``None`` at step 0); for an offline run the one row (only ``last`` defined).
    Summaries are in the leaderboard's units (percent for ``%``), as the record's ``metrics``."""

    step: int
    rows: dict[str, list[float]]
    specs: tuple[MetricSpec, ...]
    sizes: list[int]
    offline: bool
    summaries: dict[str, float | None]

    @classmethod
    def after(cls, step: int, matrices: Mapping[str, Sequence[Sequence[float]]], sizes: Sequence[int],
              specs: Sequence[MetricSpec], offline: bool) -> Evaluation:
        """The evaluation of row ``step`` of ``matrices`` (the rows stored so far, ``step + 1`` of them)."""
        n = len(sizes) if offline else step + 1
        summaries: dict[str, float | None] = {}
        for spec in specs:
            block = [list(row[:n]) for row in matrices[spec.name][:step + 1]]
            summaries.update(summarize_matrix(block, list(sizes[:n]), spec, offline))
        return cls(step, {k: list(v[step]) for k, v in matrices.items()}, tuple(specs), list(sizes), offline,
                   summaries)

    def scalars(self) -> dict[str, float]:
        """Flat ``{name: value}`` for a logger, in the leaderboard's units: ``<metric>/exp<j>`` for each experience
        ``j`` seen so far (all of them for an offline run; a class-incremental ``R[i, j > i]`` is 0 by construction)
        and each summary column defined so far."""
        seen = len(self.sizes) if self.offline else self.step + 1
        out = {f"{spec.name}/exp{j}": spec.scale * float(v) for spec in self.specs
               for j, v in enumerate(self.rows[spec.name][:seen])}
        out.update({k: v for k, v in self.summaries.items() if v is not None})
        return out


class Callback:
    """No-op hooks; subclass and override what you need. :meth:`setup` is called once before training with the
    :class:`CallbackContext` (kept as ``self.context``); :meth:`close` once after the last experience (or after the
    last batch of a member job). The runner fires :meth:`on_evaluation` after each step's evaluation and, once the
    record's metrics are known (after :meth:`close` and :meth:`extra_metrics`), :meth:`on_run_end` with them; both
    only in the run's own process (a member job sees neither), and ``on_run_end`` only for a run that finished.

    ``observer = True`` declares a callback that only watches (loggers, traces): it changes neither the training nor
    the record, so it is left out of the run's identity (:meth:`clbench.specs.RunSpec.identity`) and adding or
    removing it resumes a finished run instead of running it again. Leave it False for anything that changes what
    is trained or recorded (private training, a batch plan, extra metrics) or that writes what a later command
    reads from the run (the dual-form recorder's patterns)."""

    observer: ClassVar[bool] = False
    context: CallbackContext

    def setup(self, context: CallbackContext) -> None:
        self.context = context

    def on_experience_start(self, experience: int) -> None: ...

    def on_experience_end(self, experience: int) -> None: ...

    def on_batch_start(self, x: Tensor, y: Tensor) -> None: ...

    def after_forward(self, loss: Tensor) -> None: ...

    def after_backward(self, model: nn.Module) -> None: ...

    def after_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def on_epoch_end(self, epoch: int) -> None: ...

    def on_evaluation(self, evaluation: Evaluation) -> None: ...

    def close(self) -> None: ...

    def on_run_end(self, metrics: Mapping[str, Any]) -> None:
        """``metrics``: the record's ``metrics`` (summary columns, costs, ``extra``: :mod:`clbench.runner`)."""

    def batch_sampler(self, n: int, batch_size: int, epochs: int) -> BatchPlan | None:
        """How the coming training call (``epochs`` over ``n`` samples, minibatches of ``batch_size``) draws its
        minibatches; None (the default) keeps the loop's own."""
        return None

    def extra_metrics(self) -> dict[str, float]:
        """Numbers recorded under the run's ``metrics.extra`` (leaderboard columns), read after :meth:`close`."""
        return {}


class CallbackList(Callback):
    """The callbacks of one training process, in attachment order, with the specs they were built from (so that a
    member job elsewhere can rebuild them: :meth:`specs`). Always guards the loss against non-finite values.
    ``batch_augment``: the scenario's batch augmentation that :meth:`augment_batch` applies (module docstring).
    ``unaugmented``: inside a template, the current training minibatch's inputs ``(B, ...)`` before the batch
    augmentation, as the data loader gave them (set by the bridge's ``before_training_iteration``; ``mb_x`` itself
    when there is no batch augmentation; None before the first minibatch). A strategy that stores minibatch rows and
    replays them in later minibatches stores these rows: the bridge augments the replayed rows then, once."""

    def __init__(self, batch_augment: CropFlip | None = None) -> None:
        self.callbacks: list[Callback] = []
        self._specs: list[CallbackSpec] = []
        self.context = CallbackContext()
        self.batch_augment = batch_augment
        self.unaugmented: Tensor | None = None

    def augment_batch(self, x: Tensor) -> Tensor:
        """A training minibatch ``(B, C, H, W)`` -> ``batch_augment.batch(x)`` ``(B, C, size, size)`` on
        ``x.device`` (draws from torch's global CPU generator); ``x`` itself when there is no batch augmentation.
        Called once per training minibatch by every loop (module docstring), never at evaluation."""
        BATCH_HOOKS_FIRED["augment_batch"] += 1
        return x if self.batch_augment is None else self.batch_augment.batch(x)

    @classmethod
    def build(cls, specs: Iterable[CallbackSpec], context: CallbackContext) -> CallbackList:
        """A list holding ``CALLBACKS.get(spec.name)(**spec.args)`` for each spec, set up with ``context``."""
        built = cls()
        built.attach(specs, context)
        return built

    def attach(self, specs: Iterable[CallbackSpec], context: CallbackContext) -> None:
        self.context = context
        for spec in specs:
            callback = CALLBACKS.get(spec.name)(**spec.args)
            callback.setup(context)
            self.callbacks.append(callback)
            self._specs.append(spec)

    def specs(self) -> tuple[CallbackSpec, ...]:
        return tuple(self._specs)

    def find(self, kind: type[C]) -> C | None:
        """The first attached callback that is a ``kind`` (e.g. the ``dp`` callback a strategy talks to), or None."""
        return next((c for c in self.callbacks if isinstance(c, kind)), None)

    def on_experience_start(self, experience: int) -> None:
        for c in self.callbacks:
            c.on_experience_start(experience)

    def on_experience_end(self, experience: int) -> None:
        for c in self.callbacks:
            c.on_experience_end(experience)

    def on_batch_start(self, x: Tensor, y: Tensor) -> None:
        BATCH_HOOKS_FIRED["on_batch_start"] += 1
        for c in self.callbacks:
            c.on_batch_start(x, y)

    def after_forward(self, loss: Tensor) -> None:
        value = float(loss.detach().float().sum())
        if not math.isfinite(value):
            raise NonFiniteLossError("the training loss", value)
        for c in self.callbacks:
            c.after_forward(loss)

    def after_backward(self, model: nn.Module) -> None:
        for c in self.callbacks:
            c.after_backward(model)

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        for c in self.callbacks:
            c.after_step(optimizer)

    def on_epoch_end(self, epoch: int) -> None:
        for c in self.callbacks:
            c.on_epoch_end(epoch)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        for c in self.callbacks:
            c.on_evaluation(evaluation)

    def close(self) -> None:
        for c in self.callbacks:
            c.close()

    def on_run_end(self, metrics: Mapping[str, Any]) -> None:
        for c in self.callbacks:
            c.on_run_end(metrics)

    def batch_sampler(self, n: int, batch_size: int, epochs: int) -> BatchPlan | None:
        plans = [(c, p) for c in self.callbacks if (p := c.batch_sampler(n, batch_size, epochs)) is not None]
        if len(plans) > 1:
            raise ValueError(f"callbacks {[type(c).__name__ for c, _ in plans]} each want to choose the minibatches; "
                             f"attach at most one of them.")
        return plans[0][1] if plans else None

    def extra_metrics(self) -> dict[str, float]:
        return {k: v for c in self.callbacks for k, v in c.extra_metrics().items()}


class CallbackBridge:
    """Bridges a :class:`CallbackList` into an Avalanche ``SupervisedTemplate``. Append it LAST to the template's
    plugins (:func:`bridge`) so that ``after_forward`` sees the loss with every plugin's term added (EWC, LwF, ...)
    and ``after_backward`` the gradients after every plugin's change (GEM's projection, ...).

    The plugin itself is ``CallbackPlugin``: this class with Avalanche's ``SupervisedPlugin`` (its no-op hooks),
    made when first asked for (:func:`bridge`, ``from clbench.callbacks import CallbackPlugin``), so that a run whose
    strategy uses no template never imports ``avalanche.training`` (seconds and over a GB)."""

    def __init__(self, callbacks: CallbackList) -> None:
        super().__init__()
        self.callbacks = callbacks

    def before_training_exp(self, strategy, **kwargs) -> None:
        """Offer the callbacks the experience's minibatch sampling (after the template built its data loader)."""
        self.epoch = 0
        plan = self.callbacks.batch_sampler(len(strategy.adapted_dataset), strategy.train_mb_size,
                                            strategy.train_epochs)
        if plan is not None:
            strategy.dataloader = planned_loader(strategy, plan)

    def before_training_iteration(self, strategy, **kwargs) -> None:
        """The batch augmentation of the minibatch (on the template's device; the minibatch before it kept as
        ``callbacks.unaugmented``), then ``on_batch_start``."""
        self.callbacks.unaugmented = strategy.mb_x
        x = self.callbacks.augment_batch(strategy.mb_x)
        if x is not strategy.mb_x:
            strategy.mbatch[0] = x
        self.callbacks.on_batch_start(strategy.mb_x, strategy.mb_y)

    def before_backward(self, strategy, **kwargs) -> None:
        self.callbacks.after_forward(strategy.loss)

    def after_backward(self, strategy, **kwargs) -> None:
        self.callbacks.after_backward(strategy.model)

    def after_update(self, strategy, **kwargs) -> None:
        self.callbacks.after_step(strategy.optimizer)

    def after_training_epoch(self, strategy, **kwargs) -> None:
        self.callbacks.on_epoch_end(self.epoch)
        self.epoch += 1


class _PlannedBatches(torch.utils.data.Sampler):
    """A ``DataLoader`` ``batch_sampler`` drawing one epoch of a :data:`BatchPlan` per iteration."""

    def __init__(self, plan: BatchPlan, generator: torch.Generator) -> None:
        self.plan, self.generator = plan, generator

    def __iter__(self):
        return (batch.tolist() for batch in self.plan(self.generator))


def planned_loader(template: Any, plan: BatchPlan) -> torch.utils.data.DataLoader:
    """A data loader over the template's ``adapted_dataset`` whose minibatches follow ``plan`` (seeded from the
    global RNG). Refused when the template's own loader does more than batch one dataset (replay, several task
    groups): the plan would silently drop that."""
    loader, dataset = template.dataloader, template.adapted_dataset
    tasks = getattr(dataset, "targets_task_labels", None)
    single_task = tasks is None or len(tasks.uniques) <= 1
    plain = type(loader) is torch.utils.data.DataLoader or (type(loader).__name__ == "TaskBalancedDataLoader"
                                                            and single_task)
    if not plain:
        raise ValueError(f"{type(template).__name__} trains through a {type(loader).__name__}; a callback that "
                         f"chooses the minibatches (e.g. dp) supports plain single-dataset loaders only.")
    generator = torch.Generator().manual_seed(int(torch.randint(2**31 - 1, ())))
    return torch.utils.data.DataLoader(dataset, batch_sampler=_PlannedBatches(plan, generator),
                                       collate_fn=getattr(dataset, "collate_fn", None))


@functools.cache
def _plugin_class() -> type:
    from avalanche.training.plugins import SupervisedPlugin

    return type("CallbackPlugin", (CallbackBridge, SupervisedPlugin),
                {"__module__": __name__, "__doc__": CallbackBridge.__doc__})


def __getattr__(name: str) -> Any:
    """``CallbackPlugin`` (:class:`CallbackBridge` with Avalanche's ``SupervisedPlugin``), made on first use."""
    if name == "CallbackPlugin":
        return _plugin_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bridge(template: Any, callbacks: CallbackList) -> None:
    """Make ``template`` (an Avalanche ``SupervisedTemplate``) fire ``callbacks``: appended after its own plugins."""
    template.plugins.append(_plugin_class()(callbacks))


@CALLBACKS.register("hook_trace")
class HookTrace(Callback):
    """Appends one JSON line per hook call (``{"hook": ..., "member": ..., ...}``) to ``<artifacts>/hooks.jsonl``:
    the order in which a loop fires the hooks, for debugging a strategy or checking a new loop. ``batches``: the
    number of batch-level hook groups written per experience (later ones are counted, not written). An observer:
    outside the run's identity."""

    observer = True

    def __init__(self, batches: Annotated[int, AT_LEAST_1] = 1000) -> None:
        self.batches = batches
        self.seen = 0

    def setup(self, context: CallbackContext) -> None:
        """In the run's own process, an earlier attempt's ``hooks.jsonl`` is removed: the file holds this run's
        hooks only (its members append theirs after this)."""
        super().setup(context)
        if context.artifacts is not None and not context.member:
            (context.artifacts / "hooks.jsonl").unlink(missing_ok=True)

    def _write(self, hook: str, **fields: Any) -> None:
        if self.context.artifacts is None:
            return
        self.context.artifacts.mkdir(parents=True, exist_ok=True)
        with open(self.context.artifacts / "hooks.jsonl", "a") as f:
            f.write(json.dumps({"hook": hook, "member": self.context.member, **fields}) + "\n")

    def on_experience_start(self, experience: int) -> None:
        self.seen = 0
        self._write("on_experience_start", experience=experience)

    def on_experience_end(self, experience: int) -> None:
        self._write("on_experience_end", experience=experience, batches=self.seen)

    def on_batch_start(self, x: Tensor, y: Tensor) -> None:
        self.seen += 1
        if self.seen <= self.batches:
            self._write("on_batch_start", batch=len(y))

    def after_forward(self, loss: Tensor) -> None:
        if self.seen <= self.batches:
            self._write("after_forward", loss=float(loss.detach()))

    def after_backward(self, model: nn.Module) -> None:
        if self.seen <= self.batches:
            grads = sum(p.grad is not None for p in model.parameters())
            self._write("after_backward", params_with_grad=grads)

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.seen <= self.batches:
            self._write("after_step")


__all__ = ["CALLBACKS", "BatchPlan", "Callback", "CallbackBridge", "CallbackContext", "CallbackList", "CallbackSpec",
           "Evaluation", "HookTrace", "bridge", "planned_loader"]
