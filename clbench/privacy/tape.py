"""The recording half of ghost clipping: hooks that keep, for one forward and one backward, each hooked module's
activations ``A`` and output gradients ``G`` (:class:`~clbench.privacy.rules.Call`), then ask the module's rule for
per-sample squared norms and weighted gradient sums.

Every module under the roots that owns trainable parameters is hooked by its rule in
:data:`~clbench.privacy.rules.RULES`, or lies under a module whose rule covers its subtree (``Rule.subtree``), or
gets the exact fallback (:mod:`clbench.privacy.fallback`: bare parameters added to, multiplied with or concatenated
with its activations followed by :mod:`clbench.privacy.bare`, any other call replayed per sample with
``torch.func``; a parametrized module replayed whole); a module under one whose tensors are laid out
sample-second (:data:`~clbench.privacy.rules.SEQUENCE_FIRST`) has its calls handed to its rule sample-first. While
a root's forward runs, :class:`~clbench.privacy.uses.Watch` follows what no layer sees: a layer's weight used bare
in a matrix product (a tied output head), a layer's output computed without the sample dimension and broadcast over
the batch (positions), and notes any other use of a parameter outside its layer. A parameter with several uses
(owned by two modules, or also used in a bare product) is clipped as one (:mod:`clbench.privacy.tied`); calls on
packed rows (:mod:`clbench.privacy.packing`) go to rules that accept them.

Two checks stand between the rules and a wrong norm: after the backward every parameter with a gradient must have
been seen by a hook (:meth:`Tape.check_explained`), and the rules must explain each parameter's WHOLE gradient
(:meth:`Tape.explain`, the first-step invariant): ``Σ_i w_i ∇θ_i`` from the rules must equal autograd's gradient of
``Σ_i w_i L_i`` for every parameter, else the parameter has a use no rule accounts for, and it is refused by name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from clbench.privacy import attention  # noqa: F401 - registers torch's attention rules, read here
from clbench.privacy.fallback import OWNED, REPLAYED, rule_for
from clbench.privacy.independence import RootCall, check_independent
from clbench.privacy.rules import (
    REPLAYING,
    SEQUENCE_FIRST,
    Call,
    Recorder,
    Rule,
    UnsupportedLayerError,
    as_sequence,
    own,
    rows,
)
from clbench.privacy.tied import FORMS, Form, Product, check_shared, cross_sq_norms
from clbench.privacy.uses import Watch


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


def _widen(sides: tuple[Tensor, Tensor], rows: tuple[int, int] | None, total: int) -> tuple[Tensor, Tensor]:
    """``(L, R)`` of a product that used the rows ``[start, stop)`` of a parameter with ``total`` rows: ``L``'s
    last dimension (those rows) placed among zeros for the others."""
    left, right = sides
    if rows is None:
        return left, right
    return torch.nn.functional.pad(left, (rows[0], total - rows[1])), right


def relative_tolerance(dtype: torch.dtype) -> float:
    """The first-step invariant's relative tolerance: ``√ε`` of the dtype (float32 3.5e-4, float64 1.5e-8)."""
    return float(torch.finfo(dtype).eps) ** 0.5


class Tape:
    """Hooks on every parameter-owning module of ``roots`` (installed on construction, removed by :meth:`close` or
    on leaving a ``with`` block). :meth:`reset` before each batch; calls made while no gradient can flow (evaluation
    under ``no_grad``) are not recorded."""

    def __init__(self, *roots: nn.Module) -> None:
        self.names: dict[nn.Module, str] = {}
        self.rules: dict[nn.Module, Rule] = {}
        self.owners: dict[int, list[tuple[nn.Module, str, str]]] = {}   # id(param) -> [(module, name, param name)]
        self.params: dict[int, nn.Parameter] = {}
        self.calls: dict[nn.Module, list[Call]] = {}
        self.products: dict[int, list[Call]] = {}                      # id(param) -> its bare product uses
        self.handles: list = []
        self.active: Counter = Counter()
        self.depth = 0
        self.keep_outputs = False
        self.outputs: list[Tensor] = []
        self.root_calls: list[RootCall] = []
        for root in roots:
            covered: list[str] = []                    # prefixes of subtrees whose root's rule covers them
            layouts = sequence_first(root)
            for name, module in root.named_modules():
                params = own(module)
                if not params or module in self.names or any(name.startswith(c) for c in covered):
                    continue
                rule = rule_for(module)
                if rule in (OWNED, REPLAYED) and layouts[module]:
                    raise UnsupportedLayerError(
                        f"per-sample gradient norms: no rule for {type(module).__qualname__} at {name or '<root>'!r}, "
                        f"which owns trainable parameters {sorted(params)} and works on sample-second tensors; "
                        f"freeze them or add a rule with clbench.privacy.register_rule.")
                for pname, p in params.items():
                    self.owners.setdefault(id(p), []).append((module, name, pname))
                    self.params[id(p)] = p
                if rule.subtree:
                    covered.append(f"{name}." if name else "")
                self.names[module] = name
                self.rules[module] = rule
                self.handles += rule.install(module, self._recorder(module, layouts[module]))
                self.handles += self._activity(module)
        for owners in self.owners.values():
            if len(owners) > 1:
                check_shared(owners)
        self.watch = Watch({i: (p, [m for m, _, _ in self.owners[i]], self.param_name(p))
                            for i, p in self.params.items()}, self.active, self._product_recorder)
        for root in roots:
            self.handles += self._root(root)
        self.reset()

    def param_name(self, p: nn.Parameter) -> str:
        """``module.path.param`` of a hooked parameter (its first owner's name for a shared one)."""
        _, where, pname = self.owners[id(p)][0]
        return f"{where}.{pname}" if where else pname

    def _recorder(self, module: nn.Module, sample_second: bool) -> Recorder:
        return Recorder(lambda call: self.calls.setdefault(module, []).append(call), self.names[module], sample_second,
                        follow=self._follow)

    def _product_recorder(self, p: nn.Parameter) -> Recorder:
        return Recorder(lambda call: self.products.setdefault(id(p), []).append(call), self.param_name(p), False)

    def _follow(self, call: Call, out: Any) -> None:
        if self.depth and call.role is None:
            self.watch.follow(call, out)

    def _activity(self, module: nn.Module) -> list:
        """Hooks keeping ``self.active[module]`` = how many of its forwards are running."""
        def enter(m: nn.Module, args: tuple) -> None:
            self.active[m] += 1

        def leave(m: nn.Module, args: tuple, output: Any) -> None:
            self.active[m] -= 1
        return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]

    def _root(self, root: nn.Module) -> list:
        """Hooks entering the :class:`~clbench.privacy.uses.Watch` for the outermost root forward that can
        produce gradients (and, when :attr:`keep_outputs`, keeping the call for the independence check and its
        outputs)."""
        def enter(m: nn.Module, args: tuple, kwargs: dict) -> None:
            if REPLAYING.get():
                return
            if self.depth or torch.is_grad_enabled():
                if self.depth == 0:
                    self.watch.__enter__()
                    if self.keep_outputs:
                        self.root_calls.append(RootCall.before(m, args, kwargs))
                self.depth += 1

        def leave(m: nn.Module, args: tuple, output: Any) -> None:
            if not self.depth or REPLAYING.get():
                return
            self.depth -= 1
            if self.depth == 0:
                self.watch.__exit__(None, None, None)
                if self.keep_outputs:
                    outs = [t for t in tree_flatten(output)[0] if isinstance(t, Tensor)]
                    self.root_calls[-1].traced = [k for k, t in enumerate(outs) if t.requires_grad]
                    self.outputs += [t for t in (output if isinstance(output, (list, tuple)) else (output,))
                                     if isinstance(t, Tensor) and t.requires_grad]
        return [root.register_forward_pre_hook(enter, with_kwargs=True),
                root.register_forward_hook(leave, always_call=True)]

    def check_independent(self, batch: int) -> bool:
        """The models' forwards kept since :attr:`keep_outputs` was set give each sample an output that depends on
        that sample alone (:func:`~clbench.privacy.independence.check_independent`, which raises naming what mixes
        them); False when the batch was too small to tell (the calls are then kept for the next batch's check)."""
        checked = check_independent(self.root_calls, batch)
        if checked:
            self.root_calls = []
        return checked

    def reset(self) -> None:
        """Forget the recorded calls (before the next forward)."""
        self.calls, self.products, self._ops, self.outputs, self.root_calls = {}, {}, None, [], []
        self.watch.outputs, self.watch.unbatched, self.watch.calls, self.watch.notes = {}, {}, {}, {}

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
    def _checked(self, calls: list[Call], batch: int, where: str, packed: bool) -> list[Call]:
        """The calls whose output received a gradient, made per sample: broadcast outputs split by sample, packed
        rows given the batch size; dimension 0 must be the sample (or the row of a packed call)."""
        done = []
        for c in calls:
            if c.grad is None:
                continue
            unbatched = self.watch.unbatched.pop(id(c), None)
            if unbatched is not None:
                unbatched.per_sample(c, batch, where)
            if c.index is not None:
                if not packed:
                    raise UnsupportedLayerError(f"the layer at {where!r} was called on packed rows (rows_of), which "
                                                f"its rule does not support; call it on (B, ...) tensors.")
                if c.grad.shape[0] != len(c.index) or (len(c.index) and int(c.index.max()) >= batch):
                    raise UnsupportedLayerError(f"the layer at {where!r} was called on {c.grad.shape[0]} packed rows "
                                                f"with a sample index of {len(c.index)} entries (values below the "
                                                f"batch size {batch} required): give rows_of one index per row.")
                c.batch = batch
            elif c.grad.shape[0] != batch:
                raise UnsupportedLayerError(
                    f"the layer at {where!r} was called on a tensor of leading dimension {c.grad.shape[0]}, not the "
                    f"batch size {batch}: per-sample norms need the sample dimension first in every hooked layer "
                    f"(or packed rows with their sample index: clbench.privacy.packing.rows_of).")
            done.append(c)
        return done

    def _filled(self, batch: int) -> dict[nn.Module, list[Call]]:
        """The calls whose output received a gradient, per module (see :meth:`_checked`)."""
        out = {}
        for module, calls in self.calls.items():
            done = self._checked(calls, batch, self.names[module], self.rules[module].packed)
            if done:
                out[module] = done
        return out

    def _product_forms(self, batch: int) -> dict[int, Product]:
        """Each parameter's bare product uses joined into one :class:`~clbench.privacy.tied.Product`."""
        out = {}
        for key, calls in self.products.items():
            done = self._checked(calls, batch, self.param_name(self.params[key]), packed=True)
            if not done:
                continue
            total = self.params[key].shape[0]
            spans = {c.role.rows or (0, total) for c in done}
            sides = [(c.saved[0], c.grad) if c.role.x_left else (c.grad, c.saved[0]) for c in done]
            if len(spans) > 1:                          # different row blocks: each placed among the parameter's rows
                sides = [_widen(side, c.role.rows, total) for side, c in zip(sides, done)]
                spans = {(0, total)}
            (start, _), = spans
            if any(c.index is not None for c in done):
                r = rows([(right, left, c.index) for (left, right), c in zip(sides, done)], batch)
                out[key] = Product(r.g, r.a, r.index, batch, start, total)
            else:
                lefts, rights = [as_sequence(left) for left, _ in sides], [as_sequence(right) for _, right in sides]
                out[key] = Product(torch.cat(lefts, 1) if len(lefts) > 1 else lefts[0],
                                   torch.cat(rights, 1) if len(rights) > 1 else rights[0], None, batch, start, total)
        return out

    def check_explained(self, params: Iterable[nn.Parameter], batch: int) -> None:
        """Raise unless every parameter in ``params`` (those that received a gradient) is owned by a hooked module
        whose calls received output gradients in this backward."""
        filled, products = self._filled(batch), self._product_forms(batch)
        for p in params:
            owners = self.owners.get(id(p), [])
            if not any(module in filled for module, _, _ in owners) and id(p) not in products:
                where = " and ".join(f"{type(m).__qualname__} at {q!r} ({n})" for m, q, n in owners) or \
                    "a module outside the hooked models"
                raise UnsupportedLayerError(
                    f"a parameter of shape {tuple(p.shape)} owned by {where} received a gradient that no hook saw "
                    f"(its module was not called through forward, e.g. nn.MultiheadAttention's out_proj); "
                    f"per-sample norms would leave it out.")

    def _operands(self, batch: int) -> tuple[dict[nn.Module, object], dict[int, Product]]:
        """Each called module's rule operands (``A``, ``G``, ...) and each parameter's bare products, formed once
        per batch."""
        if self._ops is None:
            self._ops = ({module: self.rules[module].operands(module, calls)
                          for module, calls in self._filled(batch).items()}, self._product_forms(batch))
        return self._ops

    def _uses(self, ops: dict[nn.Module, object], products: dict[int, Product]) -> dict[int, list[Form]]:
        """The forms of every use of each parameter that has more than one (shared, or used in a bare product)."""
        out = {}
        for key, owners in self.owners.items():
            if len(owners) == 1 and key not in products:
                continue
            uses = [FORMS[type(m)](m, ops[m])[n] for m, _, n in owners if m in ops]
            if key in products:
                if len(owners) > 1 or type(owners[0][0]) in FORMS or owners[0][0] not in ops:
                    uses.append(products[key])
                else:
                    m, q, n = owners[0]
                    raise UnsupportedLayerError(
                        f"the parameter {self.param_name(self.params[key])} of {type(m).__qualname__} is also used "
                        f"in a matrix product outside the layer; per-sample norms support that for nn.Linear and "
                        f"nn.Embedding weights only.")
            out[key] = uses
        return out

    def sq_norms(self, batch: int) -> Tensor:
        """``Σ_θ ‖∇θ_i‖²: (B,)`` over every hooked parameter, for the loss whose backward ran."""
        ops, products = self._operands(batch)
        parts = [self.rules[module].sq_norms(module, o) for module, o in ops.items()]
        parts += [product.sq_norms() for product in products.values()]
        for uses in self._uses(ops, products).values():
            extra = cross_sq_norms(uses)
            if extra is not None:
                parts.append(extra)
        if not parts:
            raise UnsupportedLayerError("no hooked layer received a gradient: nothing to clip.")
        return sum(parts[1:], parts[0])

    def weighted_grads(self, w: Tensor) -> dict[nn.Parameter, Tensor]:
        """``{θ: Σ_i w_i ∇θ_i}`` for every hooked parameter that received a gradient (``w: (B,)``); a parameter
        with several uses gets the sum over them."""
        ops, products = self._operands(len(w))
        out: dict[nn.Parameter, Tensor] = {}
        for module, o in ops.items():
            params = own(module)
            for name, value in self.rules[module].weighted(module, o, w).items():
                p = params[name]
                out[p] = out[p] + value if p in out else value
        for key, product in products.items():
            p = self.params[key]
            value = product.weighted(w).view_as(p)
            out[p] = out[p] + value if p in out else value
        return out

    def batch_gradient(self, loss: Tensor) -> dict[nn.Parameter, Tensor] | None:
        """Autograd's gradient, for every hooked parameter, of the part of ``loss`` that flows through the outputs
        of the roots' forward calls kept since :attr:`keep_outputs` was set (terms of the loss that do not depend on
        the batch, e.g. a ridge penalty on the parameters, are left out); None when no root forward was seen. Two
        extra backward passes through the retained graph (the first private step only)."""
        outs, self.outputs, self.keep_outputs = self.outputs, [], False
        grads = torch.autograd.grad(loss, outs, retain_graph=True, allow_unused=True) if outs else ()
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
        if not pairs:
            return None
        params = list(self.params.values())
        found = torch.autograd.grad([o for o, _ in pairs], params, [g for _, g in pairs], retain_graph=True,
                                    allow_unused=True)
        return {p: g for p, g in zip(params, found) if g is not None}

    def explain(self, reference: dict[nn.Parameter, Tensor], w: Tensor) -> None:
        """The invariant: for every parameter in ``reference`` (autograd's gradient of ``Σ_i w_i L_i``), the rules'
        ``Σ_i w_i ∇θ_i`` must equal it to :func:`relative_tolerance` of its norm (at least of the whole gradient's
        norm: a gradient that is zero in exact arithmetic, e.g. a key bias under softmax, is rounding noise); else
        raise, in one line, naming the parameter, the share of its gradient left unexplained and its uses outside its
        layer that no rule follows."""
        ours = self.weighted_grads(w)
        floor = torch.stack([g.norm() for g in reference.values()]).norm() if reference else 0
        for p, want in reference.items():
            have = ours.get(p)
            missing = (want if have is None else want - have.view_as(want)).norm()
            scale = torch.maximum(want.norm() + (have.norm() if have is not None else 0), floor)
            if missing > relative_tolerance(want.dtype) * scale:
                name = self.param_name(p) if id(p) in self.owners else f"of shape {tuple(p.shape)}"
                seen = sorted(self.watch.notes.get(name, ()))
                use = (f"its use in {', '.join(seen)} outside its layer's forward" if seen else
                       "a use inside a layer that its rule does not follow, or a loss that is not the batch mean of "
                       "per-sample losses")
                raise UnsupportedLayerError(
                    f"per-sample gradient norms: the layer rules explain only part of the gradient of parameter "
                    f"{name} ({float(missing / want.norm().clamp_min(1e-300)):.1%} of it unaccounted: {use}); its "
                    f"per-sample norms would be wrong, so private training stops here: freeze it, write the use as "
                    f"a layer, or add a rule with clbench.privacy.register_rule.")

def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def per_sample_grad_norms(model: nn.Module, loss_fn, inputs: Tensor, targets: Tensor) -> Tensor:
    """``‖∇_θ L_i‖₂: (B,)`` over all trainable parameters ``θ`` of ``model``, for ``L = loss_fn(model(inputs),
    targets)`` of shape ``(B,)`` (per-sample losses, summed), from ONE forward and ONE backward and without
    per-sample gradients (see :mod:`clbench.privacy.rules`). Raises
    :class:`~clbench.privacy.rules.UnsupportedLayerError` for a model that mixes the samples of the batch
    (:mod:`clbench.privacy.independence`), for a module that neither a rule nor the fallback can follow, and for a
    parameter whose gradient the rules do not explain in full (:meth:`Tape.explain`)."""
    params = trainable(model)
    batch = len(inputs)
    with Tape(model) as tape:
        tape.keep_outputs = True
        out = model(inputs)
        tape.check_independent(batch)
        losses = loss_fn(out, targets)
        if losses.shape != (batch,):
            raise ValueError(f"loss_fn must return one loss per sample, shape ({batch},); got {tuple(losses.shape)} "
                             f"(use reduction='none').")
        grads = torch.autograd.grad(losses.sum(), params, allow_unused=True)
        tape.check_explained([p for p, g in zip(params, grads) if g is not None], batch)
        tape.explain({p: g for p, g in zip(params, grads) if g is not None}, losses.new_ones(batch))
        return tape.sq_norms(batch).clamp_min(0).sqrt()


__all__ = ["Tape", "per_sample_grad_norms", "trainable"]
