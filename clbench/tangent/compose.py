"""Tangent Model Composition: averaging ``Δ`` of tangent models that share one linearization point.

Because ``f_lin`` is linear in ``Δ``, for weights ``λ_i ≥ 0`` with ``Σ λ_i = 1``::

    f_lin(x; Σ_i λ_i Δ_i) = f(x; w0) + J_w f(x; w0) · Σ_i λ_i Δ_i = Σ_i λ_i f_lin(x; Δ_i)

so the composed model reproduces the output ensemble of ``N`` members at the inference cost of ONE member.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from clbench.tangent.model import TangentModel

Delta = Mapping[str, Tensor]


def normalized_weights(n: int, weights: Sequence[float] | None) -> list[float]:
    """``λ = weights / Σ weights`` (uniform ``1/n`` when ``weights`` is None)."""
    if n == 0:
        raise ValueError("compose() needs at least one model.")
    weights = [1.0] * n if weights is None else [float(w) for w in weights]
    if len(weights) != n or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"need {n} non-negative weights with a positive sum, got {weights}.")
    total = sum(weights)
    return [w / total for w in weights]


def average_deltas(deltas: Sequence[Delta], weights: Sequence[float] | None = None) -> dict[str, Tensor]:
    """``Σ_i λ_i Δ_i`` key by key, with ``λ`` from :func:`normalized_weights`."""
    lambdas = normalized_weights(len(deltas), weights)
    return {name: sum(lam * d[name] for lam, d in zip(lambdas, deltas)) for name in deltas[0]}


def same_linearization_point(a: TangentModel, b: TangentModel) -> bool:
    pa, pb = a.linearization_point(), b.linearization_point()
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def compose(models: Sequence[TangentModel], weights: Sequence[float] | None = None) -> TangentModel:
    """One tangent model whose ``Δ = Σ_i λ_i Δ_i`` (``λ`` = normalized ``weights``, uniform by default); its output
    equals ``Σ_i λ_i f_lin_i(x)``. All members must share the linearization point ``w0``."""
    models = list(models)
    for i, m in enumerate(models[1:], start=1):
        if not same_linearization_point(models[0], m):
            raise ValueError(f"model {i} has another linearization point than model 0; only tangent models of the "
                             f"same w0 compose.")
    composed = copy.deepcopy(models[0])
    composed.load_delta(average_deltas([m.delta_state() for m in models], weights))
    return composed
