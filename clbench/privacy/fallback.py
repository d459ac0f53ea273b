"""The exact fallback for a module without a ghost rule: per-sample gradients of the module's OWN trained parameters
from ``torch.func``, replaying the module's forward on each sample's recorded inputs.

For one forward call ``y = f(θ, x)`` of the module (``x``: its arguments, sample first where their leading
dimension is the batch ``B``; ``y``: the tensors of its output) and ``G_i = ∂L/∂y_i`` (kept by the tape's hook on
``y``), sample ``i``'s gradient is the vector-Jacobian product of the module's call on that sample alone (a batch of
one)::

    ∇θ_i = Σ_calls (∂f(θ, x_i)/∂θ)ᵀ G_i           ‖∇θ_i‖² and Σ_i w_i ∇θ_i read off them

computed with ``vmap`` over the samples of ``vjp`` over the module's ``functional_call`` (in chunks of
:data:`CHUNK` samples, bounding the memory of the replay to that many samples' activations). The children's
parameters are constants of the replay (their rules answer for them) and the tape's hooks record nothing during it
(:data:`~clbench.privacy.rules.REPLAYING`). Exact when each sample's output depends on that sample alone (checked
before the first step, :mod:`clbench.privacy.independence`) and the forward is deterministic: a random operation
(dropout in training) or an ``autograd.Function`` without a vmap rule cannot be replayed and is refused, naming the
module and the error. The replay's outputs (from the same ``vjp``) must equal the recorded call's, sample by sample,
at every step, else the call is refused: an input shared by the samples whose leading size happens to equal the
batch (a ``(T, T)`` mask with ``T = B``) is split by sample, and caught there. The first-step invariant
(:meth:`~clbench.privacy.tape.Tape.explain`) checks the replay's ``Σ_i ∇θ_i`` against autograd like every rule's.

Two rules use it (:func:`rule_for`):

- :data:`OWNED`, for a module type with no rule: its bare parameters are followed by :mod:`clbench.privacy.bare`
  (cheap: positional tables, class tokens, layer scales); a call where they are used any other way (``F.linear``,
  ``einsum``, ``h @ (W @ W.T)``, a layer of an unknown type such as ``nn.PReLU`` or ``nn.Bilinear``) is replayed;
- :data:`REPLAYED`, for a parametrized module (``torch.nn.utils.parametrizations.weight_norm``, ...): the module and
  its parametrizations' originals, replayed whole.

Cost per call of the module: one forward and one backward of the module per sample, batched by ``vmap``, and
``B × |θ_module|`` numbers for the per-sample gradients: measured 2-5× the module's own forward + backward over the
batch for matrix-product layers, far more for ``nn.Bilinear`` (docs/privacy.md, ``benchmarks/dp_cost.py --models
fallback``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.nn.utils import parametrize
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.weight_norm import WeightNorm
from torch.utils._pytree import tree_flatten, tree_unflatten

from clbench.privacy import bare
from clbench.privacy.rules import (
    REPLAYING,
    RULES,
    Call,
    DirectParts,
    LinearParts,
    Recorder,
    Rule,
    UnsupportedLayerError,
    own,
    parts_rule,
)

CHUNK = 16
"""Samples replayed at once (``vmap``'s ``chunk_size``)."""


@dataclass
class Forward:
    """One forward call of a module, kept for its replay: the input leaves (``args`` and ``kwargs`` flattened,
    tensors detached) and their structure, the positions of the output tensors that carry a gradient among the
    output's tensors (``traced``) with their values (``outputs``, copied: what the replay must reproduce), the
    module's name (``where``) and, after the backward, the gradients received (``grads``, by position in
    ``traced``; zero for one that received none)."""

    inputs: list[Any]
    spec: Any
    traced: list[int]
    outputs: list[Tensor]
    where: str
    grads: dict[int, Tensor] = field(default_factory=dict)


@dataclass
class Leaf:
    """``Call.role`` of one output tensor of a :class:`Forward` (its position among the traced outputs)."""

    forward: Forward
    position: int


class _Pending:
    """What the bare-parameter follower records during one call, handed to the tape only if it followed the call to
    the end."""

    def __init__(self, where: str) -> None:
        self.where, self.calls = where, []

    def __call__(self, call: Call) -> None:
        self.calls.append(call)


def _tensors(out: Any) -> list[Tensor]:
    return [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]


def _install(module: nn.Module, record: Recorder, follow: bool) -> list:
    """A pre-hook entering the bare-parameter follower (``follow``) and a forward hook that hands its records to
    the tape, or, when it could not follow the call (or ``follow`` is off), keeps the call for its replay."""
    following: list[tuple[bare.Follow, _Pending]] = []

    def enter(m: nn.Module, args: tuple, kwargs: dict) -> None:
        if follow and torch.is_grad_enabled() and not REPLAYING.get():
            pending = _Pending(record.where)
            mode = bare.Follow(m, pending)
            mode.__enter__()
            following.append((mode, pending))

    def leave(m: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if follow:
            if not following:                              # no gradient can flow, or a replay
                return
            mode, pending = following.pop()
            mode.__exit__(None, None, None)
            if mode.refusal is None:
                for call in pending.calls:
                    record(call)
                return
        outs = _tensors(output)
        traced = [k for k, t in enumerate(outs) if t.requires_grad]
        if not traced or REPLAYING.get():
            return
        leaves, spec = tree_flatten((args, kwargs))
        forward = Forward([t.detach() if isinstance(t, Tensor) else t for t in leaves], spec, traced,
                          [outs[k].detach().clone() for k in traced], record.where)   # later in-place ops
        for position, k in enumerate(traced):
            record(Call((), outs[k], role=Leaf(forward, position)))

    return [module.register_forward_pre_hook(enter, with_kwargs=True),
            module.register_forward_hook(leave, with_kwargs=True, always_call=True)]


def replay(module: nn.Module, forward: Forward, batch: int) -> dict[str, Tensor]:
    """``{name: ∇θ_i (B, *θ.shape)}`` of one call's per-sample gradients (see the module docstring). An input
    tensor whose leading dimension is ``batch`` is split by sample; any other input is given whole to every sample.
    The replay's outputs must reproduce the call's (:func:`reproduced`), else the call is refused."""
    params = {n: p.detach() for n, p in own(module).items()}
    batched = [isinstance(t, Tensor) and t.dim() > 0 and t.shape[0] == batch for t in forward.inputs]
    tensors = [t for t, b in zip(forward.inputs, batched) if b]
    grads = [forward.grads.get(k, torch.zeros_like(out)) for k, out in enumerate(forward.outputs)]

    def one(theta: dict[str, Tensor], sample: list[Tensor], g: list[Tensor]) -> tuple[dict[str, Tensor], tuple]:
        it = iter(sample)
        leaves = [next(it).unsqueeze(0) if b else t for t, b in zip(forward.inputs, batched)]
        args, kwargs = tree_unflatten(leaves, forward.spec)

        def call(theta: dict[str, Tensor]) -> tuple[Tensor, ...]:
            outs = _tensors(functional_call(module, theta, tuple(args), kwargs, strict=False))
            return tuple(outs[k] for k in forward.traced)
        outs, pull = vjp(call, theta)
        return pull(tuple(gi.unsqueeze(0) for gi in g))[0], outs

    token = REPLAYING.set(True)
    try:
        with torch.no_grad():
            found, outs = vmap(one, in_dims=(None, 0, 0), chunk_size=CHUNK)(params, tensors, grads)
    except (RuntimeError, NotImplementedError) as exc:
        raise UnsupportedLayerError(
            f"per-sample gradient norms: {type(module).__qualname__} at {forward.where or '<root>'!r} has no ghost "
            f"rule and torch.func could not replay its forward per sample ({str(exc).strip().splitlines()[0]}); a "
            f"random operation (dropout in training) or an autograd.Function without vmap support cannot be "
            f"replayed: move it out of the module, freeze its parameters, or add a rule with "
            f"clbench.privacy.register_rule.") from exc
    finally:
        REPLAYING.reset(token)
    if not all(reproduced(have, want) for have, want in zip(outs, forward.outputs)):
        shared = [tuple(t.shape) for t, b in zip(forward.inputs, batched) if b]
        raise UnsupportedLayerError(
            f"per-sample gradient norms: {type(module).__qualname__} at {forward.where or '<root>'!r} has no ghost "
            f"rule, and its replay on each sample's inputs did not reproduce its output, so its per-sample "
            f"gradients cannot be read off the replay: a sample's output there is not a function of that sample's "
            f"inputs alone (inputs of shapes {shared} were split by sample, their leading size being the batch size "
            f"{batch}: one shared by the samples, e.g. a (T, T) mask with T = {batch}, needs another leading size, "
            f"mask[None]; or a parameter takes a sample's place); or add a rule with "
            f"clbench.privacy.register_rule.")
    return found


def reproduced(replayed: Tensor, recorded: Tensor) -> bool:
    """Whether the replay's per-sample outputs ``(B, 1, ...)`` equal the recorded ``(B, ...)`` to ``√ε`` of the
    dtype relative to the recorded output's largest entry."""
    if replayed.shape[2:] != recorded.shape[1:] or replayed.shape[:2] != (len(recorded), 1):
        return False
    if not recorded.is_floating_point() or not recorded.numel():
        return bool(torch.equal(replayed.squeeze(1), recorded))
    scale = float(recorded.abs().max())
    return float((replayed.squeeze(1) - recorded).abs().max()) <= torch.finfo(recorded.dtype).eps ** 0.5 * scale


def _operands(module: nn.Module, calls: list[Call]) -> tuple[LinearParts, DirectParts]:
    """The per-sample gradients of the module's own parameters: the bare-parameter rule's for the calls it
    followed, plus the replay of the others, summed over the calls."""
    forwards: dict[int, Forward] = {}
    for c in calls:
        if isinstance(c.role, Leaf):
            c.role.forward.grads[c.role.position] = c.grad
            forwards.setdefault(id(c.role.forward), c.role.forward)
    _, total = bare.operands(module, [c for c in calls if not isinstance(c.role, Leaf)])
    for forward in forwards.values():
        batch = len(next(iter(forward.grads.values())))
        for name, value in replay(module, forward, batch).items():
            total[name] = total[name] + value if name in total else value
    return {}, total


OWNED = parts_rule(lambda *args: None, _operands, hook=lambda m, record, rule: _install(m, record, True))
"""The rule of a module type without one of its own: bare parameters followed, or the call replayed."""
REPLAYED = parts_rule(lambda *args: None, _operands, hook=lambda m, record, rule: _install(m, record, False),
                      subtree=True)
"""The rule of a parametrized module: replayed whole, its parametrizations' originals included."""


RECOMPUTING_HOOKS = (WeightNorm, BasePruningMethod)
"""Forward pre-hooks that recompute a module's weight from other parameters before each call, deterministically
(the old hook-based ``torch.nn.utils.weight_norm``, ``torch.nn.utils.prune``): its type's rule does not apply.
(``spectral_norm``'s hook also steps its power iteration, in place, at each call: not replayed; its module goes to
its type's rule, and the first-step invariant refuses ``weight_orig``.)"""


def rule_for(module: nn.Module) -> Rule:
    """The module's registered rule (unless a forward pre-hook of :data:`RECOMPUTING_HOOKS` recomputes its weight:
    then :data:`OWNED`, which replays the call, the hook included), else :data:`REPLAYED` for a parametrized module,
    else :data:`OWNED`."""
    rule = RULES.get(type(module))
    if any(isinstance(h, RECOMPUTING_HOOKS) for h in module._forward_pre_hooks.values()):
        return OWNED
    if rule is not None:
        return rule
    return REPLAYED if parametrize.is_parametrized(module) else OWNED


__all__ = ["CHUNK", "OWNED", "REPLAYED", "Forward", "Leaf", "replay", "reproduced", "rule_for"]
