"""One parameter with several uses, clipped as ONE parameter: weight tying (an ``nn.Embedding``'s weight used by an
``nn.Linear`` as output projection, PyTorch's ``output.weight = item_emb.weight``; phantom clipping, Ding et al.,
ICML 2024, Sec. 4) and a layer's weight also used bare in a matrix product outside the layer (GPT-2/BERT heads
``h @ wte.weight.T`` / ``F.linear(h, wte.weight)``, ``z @ fc.weight``; recorded by :mod:`clbench.privacy.uses`).

Each use ``u`` of ``P: (r, c)`` gives sample ``i`` a gradient in one of two forms::

    Product   ∇P_i^u = L_iᵀ R_i          L_i: (T, r), R_i: (T, c)    (nn.Linear: L = G, R = A; y = x P: L = x, R = G)
    Lookup    ∇P_i^u = Σ_t e_{id_t} g_tᵀ                              (nn.Embedding: ids and output gradients g)

and ``‖Σ_u ∇P_i^u‖² = Σ_u ‖∇P_i^u‖² + 2 Σ_{u<v} ⟨∇P_i^u, ∇P_i^v⟩``, where each layer's rule gives its own term and
the cross terms are formed here without forming ``∇P_i``::

    ⟨Lookup, Product⟩ = Σ_{t,s} L_i[s, id_t] ⟨R_{i,s}, g_{i,t}⟩        (the tied input/output embedding's cross term)
    ⟨Lookup, Lookup'⟩ = Σ_{t,t'} 1[id_t = id'_t'] ⟨g_t, g'_t'⟩
    ⟨Product, Product'⟩ = Σ_{s,t} ⟨L_s, L'_t⟩ ⟨R_s, R'_t⟩               (Gram form; per-sample matrices when larger)

A Product may come from packed rows (:mod:`clbench.privacy.packing`: rows with a sample index). The book-kept
weighted sum of the parameter is the sum of its uses' sums. :class:`~clbench.privacy.tape.Tape` finds the uses by
parameter identity; a parameter shared by layers other than ``nn.Linear`` / ``nn.Embedding`` weights is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from clbench.privacy.rules import (
    GRAM_CHUNK,
    Outer,
    Rows,
    UnsupportedLayerError,
    rows_sq_norms,
    rows_weighted,
)


@dataclass
class Product:
    """``∇P_i = L_iᵀ R_i``: ``left: (B, T, r)``, ``right: (B, T, c)``, or packed rows ``left: (N, r)``,
    ``right: (N, c)`` of samples ``index: (N,)``; ``left``'s ``r`` columns are the rows ``start .. start + r`` of
    ``P`` (``∇P_i`` is zero on the others; ``total``: ``P``'s number of rows, None: ``r``). ``outer``: the batched
    form's :class:`~clbench.privacy.rules.Outer` (a Linear's own, when the product is its weight's use)."""

    left: Tensor
    right: Tensor
    index: Tensor | None = None
    batch: int = 0
    start: int = 0
    total: int | None = None
    outer: Outer | None = None

    def __post_init__(self) -> None:
        if self.index is None and self.outer is None:
            self.outer = Outer(self.right, self.left)

    def rows(self) -> Rows:
        return Rows(self.right, self.left, self.index, self.batch)

    def sq_norms(self) -> Tensor:
        return rows_sq_norms(self.rows()) if self.outer is None else self.outer.sq_norms()

    def weighted(self, w: Tensor) -> Tensor:
        """``Σ_i w_i ∇P_i``, the full ``(total, c)`` parameter shape."""
        value = rows_weighted(self.rows(), w) if self.outer is None else self.outer.weighted(w)
        total = self.total or value.shape[0]
        if total == value.shape[0]:
            return value
        return torch.cat([value.new_zeros(self.start, value.shape[1]), value,
                          value.new_zeros(total - self.start - value.shape[0], value.shape[1])])

    def span(self, lo: int, hi: int) -> Tensor:
        """``left``'s columns for the rows ``lo .. hi`` of ``P`` (within its own)."""
        return self.left[..., lo - self.start:hi - self.start]


@dataclass
class Lookup:
    """``∇P_i = Σ_t e_{id_t} g_tᵀ``: ``ids: (B, T)``, ``g: (B, T, c)`` (zero at padding positions)."""

    ids: Tensor
    g: Tensor


Form = Product | Lookup


def _linear_form(module: nn.Module, ops) -> dict[str, Form]:
    if isinstance(ops, Rows):
        return {"weight": Product(ops.g, ops.a, ops.index, ops.batch)}
    return {"weight": Product(ops.g, ops.a, outer=ops)}


FORMS: dict[type, Callable[[nn.Module, object], dict[str, Form]]] = {
    nn.Linear: _linear_form,
    nn.Embedding: lambda module, ops: {"weight": Lookup(*ops)},
}
"""Layer type -> ``forms(module, rule operands) -> {parameter name: Form}``: the layers whose parameter may have
other uses."""


def check_shared(owners: list[tuple[nn.Module, str, str]]) -> None:
    """Refuse a parameter shared by owners ``[(module, qualified name, parameter name)]`` whose forms are unknown."""
    if not all(type(m) in FORMS and n == "weight" for m, _, n in owners):
        names = ", ".join(f"{q}.{n} ({type(m).__name__})" for m, q, n in owners)
        raise UnsupportedLayerError(f"one parameter is shared by {names}: per-sample norms support sharing between "
                                    f"nn.Embedding and nn.Linear weights (tied embeddings) only.")


def _lookup_product(u: Lookup, v: Product) -> Tensor:
    ids, g = u.ids - v.start, u.g                   # the product's columns; ids outside its rows contribute 0
    inside = (ids >= 0) & (ids < v.left.shape[-1])
    if not bool(inside.all()):
        ids, g = ids.clamp(0, v.left.shape[-1] - 1), g * inside.unsqueeze(-1).to(g.dtype)
    if v.index is None:
        picked = torch.gather(v.left, 2, ids.unsqueeze(1).expand(-1, v.left.shape[1], -1))         # (B, S, T)
        return (picked * torch.bmm(v.right, g.transpose(1, 2))).sum((1, 2))
    picked = torch.gather(v.left, 1, ids[v.index])                                                 # (N, T)
    inner = torch.bmm(v.right.unsqueeze(1), g[v.index].transpose(1, 2)).squeeze(1)                 # (N, T)
    return v.left.new_zeros(v.batch).index_add_(0, v.index, (picked * inner).sum(1))


def _lookup_lookup(u: Lookup, v: Lookup) -> Tensor:
    same = (u.ids.unsqueeze(2) == v.ids.unsqueeze(1)).to(u.g.dtype)
    return (same * torch.bmm(u.g, v.g.transpose(1, 2))).sum((1, 2))


def _product_product(u: Product, v: Product) -> Tensor:
    if u.index is not None or v.index is not None:
        raise UnsupportedLayerError("a parameter used in two matrix products, one of them on packed rows: "
                                    "per-sample norms support packed rows of a parameter's only product use.")
    lo, hi = max(u.start, v.start), min(u.start + u.left.shape[-1], v.start + v.left.shape[-1])
    if hi <= lo:
        return u.left.new_zeros(len(u.left))
    left_u, left_v = u.span(lo, hi), v.span(lo, hi)
    tu, tv, r, c = left_u.shape[1], left_v.shape[1], hi - lo, u.right.shape[2]
    if tu * tv * (r + c) < (tu + tv) * r * c:
        return (torch.bmm(left_u, left_v.transpose(1, 2)) * torch.bmm(u.right, v.right.transpose(1, 2))).sum((1, 2))
    return torch.cat([(torch.bmm(lu.transpose(1, 2), ru) * torch.bmm(lv.transpose(1, 2), rv)).sum((1, 2))
                      for lu, ru, lv, rv in zip(*(t.split(GRAM_CHUNK) for t in (left_u, u.right, left_v, v.right)))])


def cross(u: Form, v: Form) -> Tensor:
    """``⟨∇P_i^u, ∇P_i^v⟩: (B,)`` of two uses of one parameter."""
    if isinstance(u, Lookup):
        return _lookup_lookup(u, v) if isinstance(v, Lookup) else _lookup_product(u, v)
    return _lookup_product(v, u) if isinstance(v, Lookup) else _product_product(u, v)


def cross_sq_norms(uses: list[Form]) -> Tensor | None:
    """``2 Σ_{u<v} ⟨∇P_i^u, ∇P_i^v⟩: (B,)`` (None for a single use)."""
    terms = [cross(u, v) for k, u in enumerate(uses) for v in uses[k + 1:]]
    return 2 * sum(terms[1:], terms[0]) if terms else None


__all__ = ["FORMS", "Form", "Lookup", "Product", "check_shared", "cross", "cross_sq_norms"]
