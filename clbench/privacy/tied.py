"""Layers whose per-sample gradient norms need their own rule: a SHARED input/output embedding (phantom clipping,
Ding et al., ICML 2024, Sec. 4) and learned absolute positions.

A sequence model that ties its item embeddings uses one matrix ``E: (V, d)`` twice: as the input lookup
``x_{i,t} = E[id_{i,t}]`` and as the output projection ``s_{i,s} = E h_{i,s}`` (scores over all ``V`` items). Sample
``i``'s gradient is the sum of both uses::

    ∇E_i = Σ_t e_{id_t} g_tᵀ   +   G_iᵀ H_i                  g_t = ∂L_i/∂x_t ∈ R^d,  G_i = ∂L_i/∂S_i ∈ R^{T_o×V}
    ‖∇E_i‖² = Σ_{t,t'} 1[id_t = id_t'] ⟨g_t, g_t'⟩           (input side, as nn.Embedding)
            + Σ_{s,s'} ⟨h_s, h_s'⟩ ⟨G_s, G_s'⟩               (output side, Gram form)
            + 2 Σ_{t,s} G_{s, id_t} ⟨h_s, g_t⟩                (the cross term between the two uses)

so the tied matrix is clipped as ONE parameter without untying it and without forming ``∇E_i: (V, d)``. Declare the
tie by using :class:`TiedEmbedding` (``emb(ids)`` for the lookup, ``emb.logits(h)`` for the scores).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from clbench.privacy.rules import (
    Call,
    Rule,
    embedding_ids_grads,
    embedding_sq_norms,
    embedding_weighted,
    matmul_sq_norms,
    matmul_weighted,
    register_rule,
    traced,
)


class TiedEmbedding(nn.Module):
    """One item matrix ``weight = E: (V, d)`` used as input lookup (``forward(ids: (B, T)) -> (B, T, d)``) and as
    output projection (``logits(h: (B, T_o, d)) -> h Eᵀ: (B, T_o, V)``). ``padding_idx``: a row that looks up to
    zeros-gradient (as ``nn.Embedding``). Initialized ``N(0, init_std²)`` (padding row zero)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 init_std: float = 0.02) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = nn.Parameter(torch.randn(num_embeddings, embedding_dim) * init_std)
        if padding_idx is not None:
            with torch.no_grad():
                self.weight[padding_idx].zero_()
        self._observers: OrderedDict[int, Callable[[str, Tensor, Tensor], None]] = OrderedDict()

    def observe(self, fn: Callable[[str, Tensor, Tensor], None]) -> RemovableHandle:
        """Call ``fn(kind, input, output)`` after each use (``kind``: ``"lookup"`` or ``"logits"``)."""
        handle = RemovableHandle(self._observers)
        self._observers[handle.id] = fn
        return handle

    def _notify(self, kind: str, x: Tensor, out: Tensor) -> Tensor:
        for fn in self._observers.values():
            fn(kind, x, out)
        return out

    def forward(self, ids: Tensor) -> Tensor:
        return self._notify("lookup", ids, F.embedding(ids, self.weight, self.padding_idx))

    def logits(self, h: Tensor) -> Tensor:
        return self._notify("logits", h, F.linear(h, self.weight))


def _tied_hook(module: TiedEmbedding, record: Callable[[Call], None], rule: Rule) -> list[RemovableHandle]:
    def seen(kind: str, x: Tensor, out: Tensor) -> None:
        if traced(out):
            record(Call((x.detach(),), out, kind))
    return [module.observe(seen)]


def _sides(module: TiedEmbedding, calls: list[Call]) -> tuple[tuple[Tensor, Tensor] | None, tuple | None]:
    """``(ids, G_in)`` of the lookups and ``(H, G_out)`` of the projections (None when a side is unused)."""
    lookups = [c for c in calls if c.kind == "lookup"]
    logits = [c for c in calls if c.kind == "logits"]
    inputs = embedding_ids_grads(module, lookups) if lookups else None
    outputs = None
    if logits:
        h = torch.cat([c.saved[0].reshape(len(c.saved[0]), -1, c.saved[0].shape[-1]) for c in logits], 1)
        g = torch.cat([c.grad.reshape(len(c.grad), -1, c.grad.shape[-1]) for c in logits], 1)
        outputs = (h, g)
    return inputs, outputs


def _tied_sq_norms(module: TiedEmbedding, calls: list[Call]) -> Tensor:
    inputs, outputs = _sides(module, calls)
    total = 0
    if inputs is not None:
        total = total + embedding_sq_norms(*inputs)
    if outputs is not None:
        total = total + matmul_sq_norms(*outputs)
    if inputs is not None and outputs is not None:
        (ids, g_in), (h, g_out) = inputs, outputs
        # cross_i = Σ_{s,t} G_out[i, s, id_t] ⟨h_s, g_t⟩
        picked = torch.gather(g_out, 2, ids.unsqueeze(1).expand(-1, g_out.shape[1], -1))      # (B, T_o, T_in)
        total = total + 2 * (picked * torch.bmm(h, g_in.transpose(1, 2))).sum((1, 2))
    return total


def _tied_weighted(module: TiedEmbedding, calls: list[Call], w: Tensor) -> dict[str, Tensor]:
    inputs, outputs = _sides(module, calls)
    total = torch.zeros_like(module.weight)
    if inputs is not None:
        total += embedding_weighted(*inputs, w, module.num_embeddings)
    if outputs is not None:
        h, g = outputs
        total += matmul_weighted(h, g, w)
    return {"weight": total}


register_rule(TiedEmbedding)(Rule(lambda *a: None, _tied_sq_norms, _tied_weighted, _tied_hook))


class LearnedPositions(nn.Module):
    """Learned absolute positions added to a sequence: ``forward(x: (B, T, d)) -> x + P[:T]`` with
    ``P: (max_len, d)``; per sample, ``∇P_i = [G_i; 0]`` (``G_i = ∂L_i/∂x: (T, d)``)."""

    def __init__(self, max_len: int, dim: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] > len(self.weight):
            raise ValueError(f"sequence length {x.shape[1]} exceeds LearnedPositions' max_len {len(self.weight)}.")
        return x + self.weight[: x.shape[1]]


def _positions_grad(calls: list[Call]) -> Tensor:
    """``Σ_calls G_c: (B, T, d)`` (every call adds ``P[:T]`` to a sequence of the same length)."""
    return torch.stack([c.grad for c in calls]).sum(0)


def _positions_weighted(module: LearnedPositions, calls: list[Call], w: Tensor) -> dict[str, Tensor]:
    g = _positions_grad(calls)
    out = torch.zeros_like(module.weight)
    out[: g.shape[1]] = torch.tensordot(w, g, dims=([0], [0]))
    return {"weight": out}


register_rule(LearnedPositions)(Rule(
    lambda module, args, output: Call((), output) if traced(output) else None,
    lambda module, calls: _positions_grad(calls).flatten(1).square().sum(1),
    _positions_weighted))


__all__ = ["LearnedPositions", "TiedEmbedding"]
