"""What the layer rules cannot see from inside a layer: uses of a layer's parameters and outputs in the model's own
forward, followed while a :class:`~clbench.privacy.tape.Tape` is installed (a ``TorchFunctionMode`` entered for
the forward of each model the tape hooks).

- **A layer's weight used bare in a matrix product** outside the layer (GPT-2/BERT tied heads ``h @ wte.weight.T``,
  ``F.linear(h, wte.weight)``; ``z @ fc.weight``): ``Y = X Q`` (``matmul``, ``@``) or ``Y = X Qᵀ`` (``F.linear``)
  with ``Q`` the weight ``P``, its transpose or a block of its rows (``P[1:]``: a head without the padding item) and
  ``X`` the activations (sample first). Sample ``i``'s gradient is
  a :class:`~clbench.privacy.tied.Product` ``L_iᵀ R_i``: ``Y = X P``: ``L = X, R = G``; ``Y = X Pᵀ``: ``L = G,
  R = X`` (``G = ∂L/∂Y``), clipped together with the layer's own use (:mod:`clbench.privacy.tied`).
- **A layer called without the sample dimension whose output is broadcast over the batch** (nanoGPT's positions
  ``x = wte(idx) + wpe(torch.arange(T))``): the output ``O`` (or ``Q = f(O)``, shape operations) is added to
  activations ``X`` with a sample dimension it lacks. The layer's call then has, per sample, the output gradient
  ``f*(Σ_{broadcast dims} G_i|_Q)`` (``G = ∂L/∂(X + Q)``) and the same inputs for every sample, and its rule takes
  it from there (:meth:`Unbatched.per_sample`). The gradient the output received must equal the sum over samples of
  these (else the output was also used another way, refused).
- **Any other use** of a parameter outside the forward of the layer that owns it (``x * fc.weight``, ...) is noted
  by its operation (:attr:`Watch.notes`): the tape's first-step check (:meth:`~clbench.privacy.tape.Tape.explain`)
  names it when it refuses the parameter.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from clbench.privacy.bare import ADD_OPS, SHAPE_OPS, Recipe, at_positions, compose, pullback
from clbench.privacy.rules import Call, Recorder, UnsupportedLayerError

MATMUL_OPS = {torch.matmul, Tensor.matmul, Tensor.__matmul__}
LINEAR_OPS = {F.linear}


@dataclass
class ProductUse:
    """A bare matrix product with a weight: ``x_left``: ``Y = X P`` (``L = X``, ``R = G``), else ``Y = X Pᵀ``
    (``L = G``, ``R = X``); ``rows = (start, stop)``: the product used the rows ``P[start:stop]`` only (e.g. a tied
    head skipping the padding item), so ``L`` covers those rows of ``P``."""

    x_left: bool
    rows: tuple[int, int] | None = None


@dataclass
class Site:
    """Where an output computed without the sample dimension met the activations: ``Q = recipe(O)`` of ``shape``
    (None: ``O`` itself), and the gradient of ``X + Q`` once the backward reached it."""

    recipe: Recipe | None
    shape: tuple[int, ...]
    grad: Tensor | None = None


@dataclass
class Unbatched:
    """The broadcast sites of one call's output (``Call.role`` stays the rule's; this rides in ``Watch.unbatched``)."""

    sites: list[Site] = field(default_factory=list)

    def per_sample(self, call: Call, batch: int, where: str) -> None:
        """Turn ``call`` into a batched call: ``grad`` ``(B, *O.shape)`` from the sites, ``saved`` tensors repeated
        for every sample."""
        if any(s.grad is None for s in self.sites):
            return
        shape = tuple(call.grad.shape)
        zero = call.grad.new_zeros(shape)
        per_sample = sum(pullback(s.recipe, zero, at_positions(s.grad, s.shape)) if s.recipe is not None
                         else at_positions(s.grad, s.shape) for s in self.sites)
        if per_sample.shape[0] != batch:
            raise UnsupportedLayerError(f"the output of the layer at {where!r}, computed without the sample "
                                        f"dimension, was broadcast over {per_sample.shape[0]} rows, not the batch of "
                                        f"{batch}.")
        scale = call.grad.abs().max().clamp_min(torch.finfo(call.grad.dtype).tiny)
        if (per_sample.sum(0) - call.grad).abs().max() > 1e-4 * scale:
            raise UnsupportedLayerError(f"the output of the layer at {where!r}, computed without the sample "
                                        f"dimension, is used other than by adding it to activations of every "
                                        f"sample (broadcast); per-sample norms cannot split its gradient by sample.")
        call.grad = per_sample
        call.saved = tuple(s.unsqueeze(0).expand(batch, *s.shape) for s in call.saved)


class Watch(TorchFunctionMode):
    """Follows one forward of the tape's models (see the module docstring).

    ``owners``: ``id(P) -> (P, its hooked owner modules, its name)`` for every trained parameter; ``active``: the
    hooked modules whose forward is running (kept by the tape's hooks); ``product(P) -> Recorder`` records a bare
    product use of ``P``."""

    def __init__(self, owners: dict[int, tuple[nn.Parameter, list[nn.Module], str]], active: Counter,
                 product: Callable[[nn.Parameter], Recorder]) -> None:
        super().__init__()
        self.owners, self.active, self.product = owners, active, product
        self.outputs: dict[int, tuple[weakref.ref, Call, Recipe | None]] = {}
        self.unbatched: dict[int, Unbatched] = {}          # id(call) -> its broadcast sites
        self.calls: dict[int, Call] = {}
        self.notes: dict[str, set[str]] = {}

    # ------------------------------------------------------------------------------------------ layer outputs
    def follow(self, call: Call, out: Tensor) -> None:
        """Follow a hooked layer call's output (it may lack the sample dimension and be broadcast over the batch)."""
        if isinstance(out, Tensor):
            self.outputs[id(out)] = (weakref.ref(out), call, None)

    def _output(self, t: Any) -> tuple[Call, Recipe | None] | None:
        hit = self.outputs.get(id(t)) if isinstance(t, Tensor) else None
        return (hit[1], hit[2]) if hit is not None and hit[0]() is t else None

    def _broadcast(self, func, args, kwargs, out) -> None:
        operands = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if len(operands) != 2 or not isinstance(out, Tensor) or not out.requires_grad:
            return
        hits = [(q, h) for q in operands if (h := self._output(q)) is not None and (
            q.dim() < out.dim() or (q.dim() == out.dim() and q.shape[0] == 1 and out.shape[0] > 1))]
        if len(hits) != 1:
            return
        q, (call, recipe) = hits[0]
        site = Site(recipe, tuple(q.shape))

        def keep(grad: Tensor) -> None:
            site.grad = grad
        out.register_hook(keep)
        self.unbatched.setdefault(id(call), Unbatched()).sites.append(site)
        self.calls[id(call)] = call

    def _shaped(self, func, args, kwargs, out) -> None:
        hit = self._output(args[0]) if args else None
        if hit is None or not isinstance(out, Tensor):
            return
        call, recipe = hit
        rest = args[1:]
        self.outputs[id(out)] = (weakref.ref(out), call, compose(recipe, lambda o: func(o, *rest, **kwargs)))

    # ------------------------------------------------------------------------------------------- parameters
    def _param(self, t: Any) -> tuple[nn.Parameter, bool, tuple[int, int] | None] | None:
        """``(P, transposed, rows)`` when ``t`` is a trained parameter ``P``, its 2-d transpose or a block of its
        rows ``P[start:stop]`` (views of it)."""
        if not isinstance(t, Tensor):
            return None
        hit = self.owners.get(id(t))
        if hit is not None and hit[0] is t:
            return t, False, None
        base = t._base
        hit = self.owners.get(id(base)) if base is not None else None
        if hit is None or hit[0] is not base or t.dim() != 2 or base.dim() != 2:
            return None
        if tuple(t.shape) == tuple(base.shape)[::-1] and t.stride() == base.stride()[::-1] and \
                t.storage_offset() == base.storage_offset():
            return base, True, None
        start, rest = divmod(t.storage_offset() - base.storage_offset(), base.stride(0))
        if t.stride() == base.stride() and t.shape[1] == base.shape[1] and not rest and \
                0 <= start and start + t.shape[0] <= base.shape[0]:
            return base, False, (start, start + t.shape[0])
        return None

    def _outside(self, p: nn.Parameter) -> bool:
        return not any(self.active[m] for m in self.owners[id(p)][1])

    def _product(self, func, args, kwargs, out) -> bool:
        """Record ``X @ Q`` / ``F.linear(X, Q)`` with ``Q`` a weight or its transpose; True when recorded."""
        if len(args) < 2 or not isinstance(out, Tensor) or not out.requires_grad:
            return False
        x, q = args[0], args[1]
        hit = self._param(q)
        if hit is None or self._param(x) is not None or not isinstance(x, Tensor) or x.dim() < 2:
            return False
        p, transposed, rows = hit
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        if not self._outside(p) or (bias is not None and self._param(bias) is not None):
            return False
        linear = func in LINEAR_OPS                    # F.linear(X, Q) = X Qᵀ
        self.product(p)(Call((x.detach(),), out, role=ProductUse(linear == transposed, rows)))
        return True

    def _note(self, func, args, kwargs) -> None:
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, (list, tuple)) else (a,):
                hit = self._param(t) or (self._param(t._base) if isinstance(t, Tensor) and t._base is not None
                                         else None)
                if hit is not None and self._outside(hit[0]):
                    self.notes.setdefault(self.owners[id(hit[0])][2], set()).add(getattr(func, "__name__", str(func)))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        with torch._C.DisableTorchFunction():              # looking at tensors must not dispatch to other modes
            self._after(func, args, kwargs, out)
        return out

    def _after(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        if func in SHAPE_OPS or getattr(func, "__name__", "") == "__get__":
            self._shaped(func, args, kwargs, out)
            return
        if func in ADD_OPS:
            self._broadcast(func, args, kwargs, out)
        if not ((func in MATMUL_OPS or func in LINEAR_OPS) and self._product(func, args, kwargs, out)) and \
                isinstance(out, Tensor) and out.requires_grad:
            self._note(func, args, kwargs)


__all__ = ["LINEAR_OPS", "MATMUL_OPS", "ProductUse", "Site", "Unbatched", "Watch"]
