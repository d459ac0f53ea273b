"""Per-sample gradient norms of bare ``nn.Parameter`` s that a module adds to its activations or concatenates with
them (positional tables, class and register tokens), for any module type without a rule of its own.

While the tape is installed, the owner's forward runs under a ``TorchFunctionMode`` that follows each of its own
trained parameters ``P`` through shape operations (indexing, ``view``/``reshape``, ``expand``, ``repeat`` over the
sample dimension, ``split``, ``to``, ...): ``Q = f(P)`` with ``f`` linear. Where ``Q`` meets an activation ``X``
whose first dimension is the sample — ``Y = X + Q`` (broadcast), ``Y = X ⊙ Q`` (a per-feature scale, e.g. layer
scale ``h * gamma``) or ``Y = cat([..., Q, X, ...], d)`` with ``d > 0`` — the gradient ``G = ∂L/∂Y`` gives sample
``i``'s gradient::

    c_i = Σ_{broadcast dims} G_i|_Q          (G restricted to Q's positions; summed where Q has size 1)
    c_i = Σ_{broadcast dims} (G_i ⊙ X_i)     (the product)
    ∇P_i = f*(c_i)                           (f's adjoint, torch.func.vjp; the identity when Q is P)

summed over the places ``P`` is used. ``Q = P.expand(B, ...)`` (a class token per sample) is followed back to ``P``.
Any other use of ``P`` — a product, a nonlinearity, two parameters combined before meeting the activations — ends
the following of that call (:attr:`Follow.refusal`, one line naming the module, the parameter and the operation);
the call is then replayed per sample by the exact fallback (:mod:`clbench.privacy.fallback`, which installs the
follower).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from clbench.privacy.rules import (
    Call,
    DirectParts,
    LinearParts,
    Recorder,
    UnsupportedLayerError,
    own,
)

Recipe = Callable[[Tensor], Tensor]

SHAPE_OPS = {Tensor.__getitem__, Tensor.view, Tensor.reshape, Tensor.unsqueeze, Tensor.squeeze, Tensor.flatten,
             Tensor.unflatten, Tensor.permute, Tensor.transpose, Tensor.t, Tensor.contiguous, Tensor.to,
             Tensor.type_as, Tensor.float, Tensor.double, Tensor.half, Tensor.narrow, Tensor.split, Tensor.chunk,
             Tensor.unbind, Tensor.view_as, Tensor.reshape_as, Tensor.clone, torch.reshape, torch.unsqueeze,
             torch.squeeze, torch.flatten, torch.permute, torch.transpose, torch.narrow, torch.split, torch.chunk,
             torch.unbind, torch.clone}
"""Operations that move a parameter's entries without combining them (linear, batch-independent)."""
EXPAND_OPS = {Tensor.expand, Tensor.expand_as, Tensor.repeat, torch.broadcast_to}
"""Operations that may copy a parameter over the sample dimension (followed back when they do)."""
ADD_OPS = {Tensor.__add__, Tensor.__radd__, Tensor.__iadd__, Tensor.add, Tensor.add_, torch.add}
MUL_OPS = {Tensor.__mul__, Tensor.__rmul__, Tensor.__imul__, Tensor.mul, Tensor.mul_, torch.mul}
CAT_OPS = {torch.cat, torch.concat, torch.concatenate}


@dataclass
class Derived:
    """A tensor computed from parameter ``name`` by shape operations: ``value = recipe(P)`` (None: ``P`` itself);
    ``per_sample``: it is ``base`` copied over a first (sample) dimension, ``base`` being followed instead."""

    name: str
    recipe: Recipe | None
    shape: tuple[int, ...]
    base: Derived | None = None


@dataclass
class Use:
    """Where a followed tensor meets the activations: ``Q``'s origin, and the slice ``(dim, start, length)`` of the
    result that holds it (concatenation; None: all of it, addition or product); ``scaled``: ``Q`` multiplies the
    activations (saved in the call), which then multiply the gradient."""

    origin: Derived
    narrow: tuple[int, int, int] | None
    scaled: bool = False


def compose(parent: Recipe | None, step: Callable[[Tensor], Tensor]) -> Recipe:
    return step if parent is None else (lambda p: step(parent(p)))


def _items(args: tuple, kwargs: dict) -> list[Any]:
    flat = []
    for a in (*args, *kwargs.values()):
        flat.extend(a if isinstance(a, (list, tuple)) else (a,))
    return flat


class Follow(TorchFunctionMode):
    """Follows the owner's parameters through one forward (see the module docstring)."""

    def __init__(self, owner: nn.Module, record: Recorder) -> None:
        super().__init__()
        self.owner, self.record = owner, record
        params = own(owner)
        self.names = sorted(params)
        self.refusal: UnsupportedLayerError | None = None
        self.followed: dict[int, tuple[Tensor, Derived]] = {
            id(p): (p, Derived(n, None, tuple(p.shape))) for n, p in params.items()}

    def _derived(self, t: Any) -> Derived | None:
        hit = self.followed.get(id(t)) if isinstance(t, Tensor) else None
        return hit[1] if hit is not None and hit[0] is t else None

    def _refuse(self, origin: Derived, func: Any, why: str) -> UnsupportedLayerError:
        name = getattr(func, "__name__", str(func))
        return UnsupportedLayerError(
            f"per-sample gradient norms: no rule for {type(self.owner).__qualname__} at "
            f"{self.record.where or '<root>'!r}, which owns trainable parameters {self.names}; its parameter "
            f"{origin.name!r} {why} ({name}), and only bare parameters added to, multiplied with or concatenated "
            f"with the activations are followed; freeze them or add a rule with clbench.privacy.register_rule.")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refusal is None:
            try:
                with torch._C.DisableTorchFunction():      # looking at tensors must not dispatch to other modes
                    self._follow(func, args, kwargs, out)
            except UnsupportedLayerError as exc:          # raised when the forward ends: a TypeError raised inside
                self.refusal = exc                        # an operator would be turned into NotImplemented
        return out

    def _follow(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        hits = [(i, d) for i, a in enumerate(_items(args, kwargs)) if (d := self._derived(a)) is not None]
        if not hits or not (isinstance(out, (Tensor, list, tuple)) and _requires_grad(out)):
            return                                       # metadata (shape, dtype, ...) or no gradient flows back
        origin = hits[0][1]
        if func in ADD_OPS:
            self._add(func, args, kwargs, out, hits)
        elif func in MUL_OPS:
            self._mul(func, args, kwargs, out, hits)
        elif func in CAT_OPS:
            self._cat(func, args, kwargs, out)
        elif len(hits) == 1 and hits[0][0] == 0 and (func in SHAPE_OPS or func in EXPAND_OPS):
            self._shaped(func, args, kwargs, out, origin)
        else:
            raise self._refuse(origin, func, "enters the forward through an operation that is not a shape change, "
                                             "an addition, a product or a concatenation")

    def _shaped(self, func, args, kwargs, out, origin: Derived) -> None:
        rest = args[1:]
        outs = out if isinstance(out, (list, tuple)) else (out,)
        for k, t in enumerate(outs):
            def step(p, k=k):
                value = func(p, *rest, **kwargs)
                return value[k] if isinstance(out, (list, tuple)) else value
            derived = Derived(origin.name, compose(origin.recipe, step), tuple(t.shape))
            parent = origin.shape
            if (func in EXPAND_OPS and t.dim() >= 1 and t.shape[0] > 1 and t.dim() >= len(parent)
                    and (len(parent) < t.dim() or parent[0] == 1)):
                derived.base = origin                    # a copy per sample: followed back to what was copied
            self.followed[id(t)] = (t, derived)

    def _use(self, origin: Derived, operand_shape: tuple[int, ...], out: Tensor, func: Any,
             narrow: tuple[int, int, int] | None, factor: Tensor | None = None) -> None:
        source = origin.base or origin
        shape = source.shape
        if len(shape) > out.dim() or (len(shape) == out.dim() and shape[0] != 1):
            raise self._refuse(origin, func, f"of shape {operand_shape} meets the activations of shape "
                                             f"{tuple(out.shape)} at their first (sample) dimension")
        saved = () if factor is None else (factor.detach().expand_as(out),)
        self.record(Call(saved, out, role=Use(source, narrow, factor is not None)))

    def _add(self, func, args, kwargs, out, hits) -> None:
        items = _items(args, kwargs)
        if len(hits) != 1 or len(items) != 2 or not isinstance(out, Tensor):
            raise self._refuse(hits[0][1], func, "is combined with another parameter or scaled before it meets the "
                                                 "activations")
        index, origin = hits[0]
        self._use(origin, tuple(items[index].shape), out, func, None)

    def _mul(self, func, args, kwargs, out, hits) -> None:
        items = _items(args, kwargs)
        if len(hits) != 1 or len(items) != 2 or not isinstance(out, Tensor) or not isinstance(items[1 - hits[0][0]],
                                                                                               Tensor):
            raise self._refuse(hits[0][1], func, "is multiplied by another parameter or a constant before it meets "
                                                 "the activations")
        index, origin = hits[0]
        self._use(origin, tuple(items[index].shape), out, func, None, factor=items[1 - index])

    def _cat(self, func, args, kwargs, out) -> None:
        tensors = args[0] if args else kwargs["tensors"]
        dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % out.dim()
        start = 0
        for t in tensors:
            origin = self._derived(t)
            if origin is not None:
                if dim == 0:
                    raise self._refuse(origin, func, "is concatenated along the sample dimension")
                if origin.base is None and out.shape[0] > 1:
                    raise self._refuse(origin, func, "is concatenated without being copied per sample (expand)")
                self._use(origin, tuple(t.shape), out, func, (dim, start, t.shape[dim]))
            start += t.shape[dim]


def _requires_grad(out: Any) -> bool:
    outs = out if isinstance(out, (list, tuple)) else (out,)
    return any(isinstance(t, Tensor) and t.requires_grad for t in outs)


def pullback(recipe: Recipe | None, p: Tensor, c: Tensor) -> Tensor:
    """``f*(c_i)`` for every sample: ``(B, *Q.shape) -> (B, *P.shape)``."""
    if recipe is None:
        return c.reshape(len(c), *p.shape)
    _, vjp = torch.func.vjp(recipe, p.detach())
    return torch.func.vmap(lambda ci: vjp(ci)[0])(c)


def at_positions(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``(B, *Y.shape[1:]) -> (B, *shape)``: a gradient of ``Y = X + Q`` (``Q`` of ``shape`` broadcast over the
    sample and any other dimension where it has size 1 or none) summed over the broadcast dimensions."""
    padded = (1,) * (g.dim() - len(shape)) + shape
    dims = [d for d in range(1, g.dim()) if padded[d] == 1 and g.shape[d] != 1]
    return (g.sum(dims, keepdim=True) if dims else g).reshape(len(g), *shape)


def operands(module: nn.Module, calls: list[Call]) -> tuple[LinearParts, DirectParts]:
    """``({}, {name: ∇P_i (B, *P.shape)})`` from the recorded uses (summed over them)."""
    params = own(module)
    grads: DirectParts = {}
    for c in calls:
        use: Use = c.role
        g = c.grad * c.saved[0] if use.scaled else c.grad
        g = g if use.narrow is None else g.narrow(*use.narrow)
        per_sample = at_positions(g, use.origin.shape)
        name = use.origin.name
        value = pullback(use.origin.recipe, params[name], per_sample)
        grads[name] = grads[name] + value if name in grads else value
    return {}, grads


__all__ = ["ADD_OPS", "EXPAND_OPS", "MUL_OPS", "SHAPE_OPS", "Follow", "at_positions", "compose", "operands",
           "pullback"]
