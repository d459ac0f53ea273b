"""Training one shard member from ``w0``: a self-contained job that a task pool can run in another process.

A :class:`MemberJob` holds exactly what one member's training needs — the ``w0`` model, the shard's cached inputs
and targets, the objective (picklable: no registry lookup in the worker), the fit settings and the member's seed —
and the trainers are module-level functions of the job alone, so members train independently, in any order and on
any :mod:`clbench.tasks` pool, with the same result: all randomness (the minibatch order) comes from ``job.seed``,
and the ViTs here have no dropout.

- :func:`train_delta`: a tangent member, ``Δ`` from zero minimizing ``L(f_lin(x; Δ), y) + λ‖Δ‖²``; returns ``Δ``.
- :func:`train_tail`: a non-linear member, the tail's weights from ``w0`` minimizing ``L(f(x; w), y)``; returns
  its state dict.

The job also carries the run's callbacks as specs (name, args) and a :class:`~clbench.callbacks.CallbackContext`
(run id, artifacts folder, member key): the trainer re-creates them where it runs, with ``{"member": model}`` as the
modules they see, so hooks fire in a spawned process or a Ray task as in the run's own process.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from clbench.callbacks import CallbackContext, CallbackList, CallbackSpec
from clbench.tangent.losses import TangentObjective
from clbench.training import FitSettings, fit


@dataclass(frozen=True)
class MemberJob:
    """One member to train. ``model``: ``w0`` as a :class:`~clbench.tangent.TangentModel` (any ``Δ``; training
    starts from zero) or a :class:`~clbench.tangent.tail.TailModel`; never modified. ``inputs``: the shard's
    cached prefix tokens ``(M, N, D)`` (images ``(M, C, H, W)`` for a tangent model whose prefix is not cacheable);
    ``targets``: ``(M,)``."""

    model: nn.Module
    inputs: Tensor
    targets: Tensor
    objective: TangentObjective            # ridge_lambda = 0 for non-linear members
    settings: FitSettings
    seed: int
    callbacks: tuple[CallbackSpec, ...] = ()
    context: CallbackContext = field(default_factory=CallbackContext)


def _callbacks(job: MemberJob, model: nn.Module) -> CallbackList:
    """The job's callbacks, rebuilt here, seeing ``{"member": model}``."""
    return CallbackList.build(job.callbacks, dataclasses.replace(job.context, modules=lambda: {"member": model}))


def train_delta(job: MemberJob) -> dict[str, Tensor]:
    """A tangent member: ``Δ`` from 0, trained on ``job``'s shard; returns ``delta_state()``."""
    model = copy.deepcopy(job.model)
    with torch.no_grad():
        for p in model.tangent_parameters():
            p.zero_()
    deltas = list(model.tangent_parameters())
    forward = model.from_prefix if model.prefix_cacheable else model
    callbacks = _callbacks(job, model)
    fit(model, forward, deltas, job.inputs, job.targets, lambda logits, y: job.objective(logits, y, deltas),
        job.settings, job.seed, callbacks)
    callbacks.close()
    return model.delta_state()


def train_tail(job: MemberJob) -> dict[str, Tensor]:
    """A non-linear member: a copy of the tail ``w0`` fine-tuned on ``job``'s cached tokens; returns its state."""
    tail = copy.deepcopy(job.model).train()
    callbacks = _callbacks(job, tail)
    fit(tail, tail, tail.parameters(), job.inputs, job.targets, job.objective, job.settings, job.seed, callbacks)
    callbacks.close()
    return {k: v.detach().clone() for k, v in tail.state_dict().items()}
