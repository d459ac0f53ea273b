"""The recording half of ghost clipping: hooks that keep, for one forward and one backward, each hooked module's
activations ``A`` and output gradients ``G`` (:class:`~clbench.privacy.rules.Call`), then ask the module's rule for
per-sample squared norms and weighted gradient sums.

Every module under the roots that owns trainable parameters is hooked by its rule in
:data:`~clbench.privacy.rules.RULES`, or lies under a module whose rule covers its subtree (``Rule.subtree``), or
has bare parameters added to or concatenated with its activations (:mod:`clbench.privacy.bare`, the rule of a type
without one: any other use of them is refused with :class:`~clbench.privacy.rules.UnsupportedLayerError`, naming
it); a module under one whose tensors are laid out sample-second
(:data:`~clbench.privacy.rules.SEQUENCE_FIRST`) has its calls handed to its rule sample-first; a
parameter owned by two modules must be a tied input/output embedding (:mod:`clbench.privacy.tied`), and after the
backward every parameter with a gradient must have been seen by its module's hooks
(:meth:`Tape.check_explained`): a parameter is never skipped silently.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from clbench.privacy.bare import BARE_PARAMETERS
from clbench.privacy.rules import RULES, SEQUENCE_FIRST, Call, Recorder, Rule, UnsupportedLayerError, own
from clbench.privacy.tied import cross_sq_norms, tie


def sequence_first(root: nn.Module) -> dict[nn.Module, bool]:
    """Each module under ``root`` -> whether its tensors are laid out ``(T, B, ...)``: the predicate of its nearest
    ancestor (or itself) in :data:`~clbench.privacy.rules.SEQUENCE_FIRST`, else False."""
    out: dict[nn.Module, bool] = {}

    def walk(module: nn.Module, inherited: bool) -> None:
        layout = SEQUENCE_FIRST.get(type(module))
        here = layout(module) if layout is not None else inherited
        out.setdefault(module, here)
        for child in module.children():
            walk(child, here)

    walk(root, False)
    return out


class Tape:
    """Hooks on every parameter-owning module of ``roots`` (installed on construction, removed by :meth:`close` or
    on leaving a ``with`` block). :meth:`reset` before each batch; calls made while no gradient can flow (evaluation
    under ``no_grad``) are not recorded."""

    def __init__(self, *roots: nn.Module) -> None:
        self.names: dict[nn.Module, str] = {}
        self.rules: dict[nn.Module, Rule] = {}
        self.owners: dict[int, list[tuple[nn.Module, str, str]]] = {}   # id(param) -> [(module, name, param name)]
        self.calls: dict[nn.Module, list[Call]] = {}
        self.handles: list = []
        for root in roots:
            covered: list[str] = []                    # prefixes of subtrees whose root's rule covers them
            layouts = sequence_first(root)
            for name, module in root.named_modules():
                params = own(module)
                if not params or module in self.names or any(name.startswith(c) for c in covered):
                    continue
                rule = RULES.get(type(module), BARE_PARAMETERS)
                if rule is BARE_PARAMETERS and layouts[module]:
                    raise UnsupportedLayerError(
                        f"per-sample gradient norms: no rule for {type(module).__qualname__} at {name or '<root>'!r}, "
                        f"which owns trainable parameters {sorted(params)} and works on sample-second tensors; "
                        f"freeze them or add a rule with clbench.privacy.register_rule.")
                for pname, p in params.items():
                    self.owners.setdefault(id(p), []).append((module, name, pname))
                if rule.subtree:
                    covered.append(f"{name}." if name else "")
                self.names[module] = name
                self.rules[module] = rule
                self.handles += rule.install(module, self._recorder(module, layouts[module]))
        self.ties = [tie(owners) for owners in self.owners.values() if len(owners) > 1]
        self.reset()

    def _recorder(self, module: nn.Module, sample_second: bool) -> Recorder:
        return Recorder(lambda call: self.calls.setdefault(module, []).append(call), self.names[module], sample_second)

    def reset(self) -> None:
        """Forget the recorded calls (before the next forward)."""
        self.calls, self._ops = {}, None

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.reset()

    def __enter__(self) -> Tape:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ results
    def _filled(self, batch: int) -> dict[nn.Module, list[Call]]:
        """The calls whose output received a gradient, per module; checks that dimension 0 is the sample."""
        out = {}
        for module, calls in self.calls.items():
            done = [c for c in calls if c.grad is not None]
            for c in done:
                if c.grad.shape[0] != batch:
                    raise UnsupportedLayerError(
                        f"{type(module).__qualname__} at {self.names[module]!r} was called on a tensor of leading "
                        f"dimension {c.grad.shape[0]}, not the batch size {batch}: per-sample norms need the sample "
                        f"dimension first in every hooked layer (e.g. expand position ids to (B, T)).")
            if done:
                out[module] = done
        return out

    def check_explained(self, params: Iterable[nn.Parameter], batch: int) -> None:
        """Raise unless every parameter in ``params`` (those that received a gradient) is owned by a hooked module
        whose calls received output gradients in this backward."""
        filled = self._filled(batch)
        for p in params:
            owners = self.owners.get(id(p), [])
            if not any(module in filled for module, _, _ in owners):
                where = " and ".join(f"{type(m).__qualname__} at {q!r} ({n})" for m, q, n in owners) or \
                    "a module outside the hooked models"
                raise UnsupportedLayerError(
                    f"a parameter of shape {tuple(p.shape)} owned by {where} received a gradient that no hook saw "
                    f"(its module was not called through forward, e.g. nn.MultiheadAttention's out_proj); "
                    f"per-sample norms would leave it out.")

    def _operands(self, batch: int) -> dict[nn.Module, object]:
        """Each called module's rule operands (``A``, ``G``, ...), formed once per batch."""
        if self._ops is None:
            self._ops = {module: self.rules[module].operands(module, calls)
                         for module, calls in self._filled(batch).items()}
        return self._ops

    def sq_norms(self, batch: int) -> Tensor:
        """``Σ_θ ‖∇θ_i‖²: (B,)`` over every hooked parameter, for the loss whose backward ran."""
        ops = self._operands(batch)
        parts = [self.rules[module].sq_norms(module, o) for module, o in ops.items()]
        parts += [cross_sq_norms(ops[emb], ops[lin]) for emb, lin in self.ties if emb in ops and lin in ops]
        total = sum(parts[1:], parts[0]) if parts else None
        if total is None:
            raise UnsupportedLayerError("no hooked layer received a gradient: nothing to clip.")
        return total

    def weighted_grads(self, w: Tensor) -> dict[nn.Parameter, Tensor]:
        """``{θ: Σ_i w_i ∇θ_i}`` for every hooked parameter that received a gradient (``w: (B,)``); a tied
        parameter gets the sum over its uses."""
        out: dict[nn.Parameter, Tensor] = {}
        for module, ops in self._operands(len(w)).items():
            params = own(module)
            for name, value in self.rules[module].weighted(module, ops, w).items():
                p = params[name]
                out[p] = out[p] + value if p in out else value
        return out


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def per_sample_grad_norms(model: nn.Module, loss_fn, inputs: Tensor, targets: Tensor) -> Tensor:
    """``‖∇_θ L_i‖₂: (B,)`` over all trainable parameters ``θ`` of ``model``, for ``L = loss_fn(model(inputs),
    targets)`` of shape ``(B,)`` (per-sample losses, summed), from ONE forward and ONE backward and without
    per-sample gradients (see :mod:`clbench.privacy.rules`). Raises
    :class:`~clbench.privacy.rules.UnsupportedLayerError` for a trainable layer without a rule."""
    params = trainable(model)
    batch = len(inputs)
    with Tape(model) as tape:
        losses = loss_fn(model(inputs), targets)
        if losses.shape != (batch,):
            raise ValueError(f"loss_fn must return one loss per sample, shape ({batch},); got {tuple(losses.shape)} "
                             f"(use reduction='none').")
        grads = torch.autograd.grad(losses.sum(), params, allow_unused=True)
        tape.check_explained([p for p, g in zip(params, grads) if g is not None], batch)
        return tape.sq_norms(batch).clamp_min(0).sqrt()


__all__ = ["Tape", "per_sample_grad_norms", "trainable"]
