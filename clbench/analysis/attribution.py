"""Attention of test queries over recorded training patterns, and the attribution of an output to them.

For a query ``x`` (the recorded layer's input at test time) and output unit ``o`` (e.g. the predicted logit)::

    α_t = x_tᵀ x                                   attention of the query on training pattern t
    c_t = e^W_t[o] α_t + e^b_t[o]                  pattern t's contribution to y[o] (the bias term when present)
    y[o] = (W_0 x + b_0)[o] + Σ_t c_t              exact for a full recording (otherwise: kept patterns only)

The paper's quantity (Irie et al.) is the attention mass ``Σ_t α_t`` over the patterns of a class or a training
task: how much of the query's retrieval goes to them, whatever values they store. It is the attribution reports lead
with; ``c_t`` (the value-weighted contribution, what the patterns add to the logit) is reported beside it.

Aggregates are sums over the patterns of one training experience and label (``(n, E, C + 1)`` tables, label −1 —
unknown — in the last column): per class and per experience they are marginals of the same table, so every
aggregation sums back to the total. ``interference`` of a query from experience ``j`` is the share of the learned part
of its predicted logit that comes from patterns of other experiences: ``Σ_{t ∉ j} c_t / Σ_t c_t`` (signed; it can
leave [0, 1] when contributions cancel, and the learned part of a logit is often a small sum of large terms of both
signs), and ``positive_interference`` the same over the positive parts only: ``Σ_{t ∉ j} c_t⁺ / Σ_t c_t⁺`` in
[0, 1] — the share of the evidence FOR the predicted logit that comes from other experiences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clbench.analysis.dual_form import values
from clbench.analysis.store import PatternStore


@dataclass
class Attribution:
    """Results for ``n`` queries over ``E`` experiences and ``C`` labels (+1 column: unknown label).

    ``contribution[q, e, c]`` = Σ c_t, ``positive[q, e, c]`` = Σ max(c_t, 0) and ``attention[q, e, c]`` = Σ α_t
    over patterns of experience e with label c;
    ``total[q]`` = Σ_t c_t; ``initial[q]`` = (W_0 x + b_0)[o]; ``top_index/top_alpha (n, k)``: the k patterns with the
    largest α_t (``top_meta (n, k, 5)``: their step, experience, sample, label, token); ``kept_fraction``: the
    store's sample fraction (1 = exact)."""

    units: np.ndarray
    contribution: np.ndarray
    positive: np.ndarray
    attention: np.ndarray
    total: np.ndarray
    initial: np.ndarray
    top_alpha: np.ndarray
    top_meta: np.ndarray
    kept_fraction: float

    def by_class(self, kind: str = "contribution") -> np.ndarray:
        """``(n, C + 1)``: summed over experiences."""
        return getattr(self, kind).sum(axis=1)

    def by_experience(self, kind: str = "contribution") -> np.ndarray:
        """``(n, E)``: summed over labels."""
        return getattr(self, kind).sum(axis=2)

    def interference(self, query_experience: np.ndarray) -> np.ndarray:
        """``(n,)``: share of Σ_t c_t from patterns of experiences other than each query's own."""
        per_exp = self.by_experience()
        own = per_exp[np.arange(len(per_exp)), query_experience]
        return (self.total - own) / self.total

    def attention_share(self, query_experience: np.ndarray) -> np.ndarray:
        """``(n,)``: share of the attention mass Σ_t α_t on patterns of experiences other than each query's own
        (in [0, 1] when every α_t ≥ 0, e.g. inputs after a ReLU)."""
        per_exp = self.by_experience("attention")
        own = per_exp[np.arange(len(per_exp)), query_experience]
        total = per_exp.sum(axis=1)
        return (total - own) / total

    def positive_interference(self, query_experience: np.ndarray) -> np.ndarray:
        """``(n,)``: share of Σ_t max(c_t, 0) from patterns of experiences other than each query's own, in [0, 1]."""
        per_exp = self.by_experience("positive")
        own = per_exp[np.arange(len(per_exp)), query_experience]
        total = per_exp.sum(axis=1)
        return (total - own) / total


def _shape(store: PatternStore, layer: str) -> tuple[int, int]:
    n_exp = n_lab = 0
    for _, _, meta, _ in store.chunks(layer):
        if len(meta):
            n_exp, n_lab = max(n_exp, int(meta[:, 1].max()) + 1), max(n_lab, int(meta[:, 3].max()) + 1)
    return n_exp, n_lab


def attribute(store: PatternStore, layer: str, queries: np.ndarray, units: np.ndarray, top_k: int = 10,
              upto: int | None = None) -> Attribution:
    """Attribution of ``y[units[q]]`` for queries ``(n, d_in)`` over the patterns of the first ``upto`` steps."""
    queries = np.asarray(queries, np.float64)
    n = len(queries)
    n_exp, n_lab = _shape(store, layer)
    contribution = np.zeros((n, n_exp, n_lab + 1))
    positive = np.zeros((n, n_exp, n_lab + 1))
    attention = np.zeros((n, n_exp, n_lab + 1))
    top_alpha = np.full((n, 0), -np.inf)
    top_meta = np.zeros((n, 0, 5), np.int64)
    rows = np.arange(n)[:, None]
    for x, e_w, e_b, meta in values(store, store.steps(), layer, upto):
        alpha = queries @ x.T                                              # (n, m)
        c = alpha * e_w[:, units].T + (0.0 if e_b is None else e_b[:, units].T)
        group = meta[:, 1].astype(np.int64) * (n_lab + 1) + np.where(meta[:, 3] < 0, n_lab, meta[:, 3])
        onehot = np.zeros((len(meta), n_exp * (n_lab + 1)))
        onehot[np.arange(len(meta)), group] = 1.0
        contribution += (c @ onehot).reshape(n, n_exp, n_lab + 1)
        positive += (np.maximum(c, 0) @ onehot).reshape(n, n_exp, n_lab + 1)
        attention += (alpha @ onehot).reshape(n, n_exp, n_lab + 1)
        k = min(top_k, alpha.shape[1])
        best = np.argpartition(-alpha, k - 1, axis=1)[:, :k] if k < alpha.shape[1] else np.tile(
            np.arange(alpha.shape[1]), (n, 1))
        merged_alpha = np.concatenate([top_alpha, alpha[rows, best]], axis=1)
        merged_meta = np.concatenate([top_meta, meta[best].astype(np.int64)], axis=1)
        order = np.argsort(-merged_alpha, axis=1)[:, :top_k]
        top_alpha, top_meta = merged_alpha[rows, order], merged_meta[rows, order]
    w0, b0 = store.initial(layer)
    initial = (queries @ w0.astype(np.float64).T)[np.arange(n), units] + (0 if b0 is None else b0[units])
    return Attribution(units=np.asarray(units), contribution=contribution, positive=positive, attention=attention,
                       total=contribution.sum(axis=(1, 2)), initial=initial, top_alpha=top_alpha, top_meta=top_meta,
                       kept_fraction=store.fraction)


def attention_over_steps(store: PatternStore, layer: str, queries: np.ndarray) -> np.ndarray:
    """``(T, E)``: for each step s and experience e, the mean over ``queries`` of Σ α_t over the patterns of step s
    from experience e (``np.cumsum(..., axis=0)`` gives the mass accumulated by step s). Linear in the query, so it
    is computed with the mean query ``x̄``: mean_q x_tᵀ x_q = x_tᵀ x̄."""
    mean = np.asarray(queries, np.float64).mean(axis=0)
    steps = store.steps()
    n_exp, _ = _shape(store, layer)
    out = np.zeros((len(steps), max(n_exp, 1)))
    for x, _, _, meta in values(store, steps, layer):
        np.add.at(out, (meta[:, 0], meta[:, 1]), x @ mean)
    return out


__all__ = ["Attribution", "attention_over_steps", "attribute"]
