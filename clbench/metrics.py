"""Standardized continual-learning metrics, computed from score matrices only (never by a strategy).

A scenario's evaluator fills one matrix per :class:`MetricSpec` it defines (classification: ``accuracy``; ranking:
``ndcg@10``, ``hit@10``). Notation for one matrix: ``R[i, j]`` is the score (a mean over the test samples of
experience ``j``) after training experience ``i``, for ``i, j = 0 .. T-1``; ``n_j`` is the number of test samples of
experience ``j``; ``s = +1`` when higher is better, ``-1`` otherwise.

- ``A_i = sum_{j<=i} R[i, j] n_j / sum_{j<=i} n_j``    score on all test data seen up to step ``i``
- ``avg_inc = mean_i A_i``                             average incremental score (DyTox's "Avg", Rebuffi et al.)
- ``last = A_{T-1}``                                   score on all test data after the last step ("Last")
- ``forgetting = mean_{j<T-1} s (best_{i<T-1} R[i, j] - R[T-1, j])``   best = max (min if lower is better)
  (Chaudhry et al., 2018)
- ``bwt = mean_{j<T-1} (R[T-1, j] - R[j, j])``         (Lopez-Paz & Ranzato, 2017)

Forward transfer is not reported: in class-incremental scenarios ``R[j-1, j] = 0`` by construction (a class cannot
be predicted before it is seen), so GEM's ``fwt`` carries no information there.

An offline run (joint training) has a single row, evaluated after training on everything: only ``last`` is defined
and the other summaries are ``None``. Summaries of a ``%`` metric are reported in percent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

SUMMARIES = ("avg_inc", "last", "forgetting", "bwt")


@dataclass(frozen=True)
class MetricSpec:
    """One score matrix an evaluator fills: its name, unit (``%``: entries are fractions in [0, 1], summaries are
    ×100), direction, whether it is the scenario's primary metric (leaderboard sort order, first plots), and the
    leaderboard column of each summary (default ``<name>_<summary>``)."""

    name: str
    unit: str = ""
    higher_is_better: bool = True
    primary: bool = False
    columns: dict[str, str] = field(default_factory=dict)

    def column(self, summary: str) -> str:
        return self.columns.get(summary, f"{self.name}_{summary}")

    @property
    def scale(self) -> float:
        return 100.0 if self.unit == "%" else 1.0

    def to_dict(self) -> dict:
        return asdict(self)


# Classification accuracy keeps the column names of the class-incremental literature.
ACCURACY = MetricSpec("accuracy", unit="%", primary=True,
                      columns={"avg_inc": "avg_inc_acc", "last": "last_acc", "forgetting": "forgetting",
                               "bwt": "bwt"})


def primary(specs: Sequence[MetricSpec]) -> MetricSpec:
    """The primary spec (the first when none is marked)."""
    return next((s for s in specs if s.primary), specs[0])


def _as_matrix(matrix: Sequence[Sequence[float]], spec: MetricSpec) -> np.ndarray:
    R = np.asarray(matrix, dtype=np.float64)
    if R.ndim != 2 or R.shape[1] == 0:
        raise ValueError(f"{spec.name} matrix must be 2-D with at least one column, got shape {R.shape}.")
    if not np.isfinite(R).all():
        raise ValueError(f"{spec.name} matrix has non-finite entries.")
    if spec.unit == "%" and ((R < 0).any() or (R > 1).any()):
        raise ValueError(f"{spec.name} matrix entries must be fractions in [0, 1].")
    return R


def seen_accuracy(R: np.ndarray, test_sizes: Sequence[int], i: int, upto: int | None = None) -> float:
    """``A_i``: sample-weighted score of row ``i`` over test experiences ``0..upto`` (default ``i``)."""
    upto = i if upto is None else upto
    n = np.asarray(test_sizes[: upto + 1], dtype=np.float64)
    return float((R[i, : upto + 1] * n).sum() / n.sum())


def summarize_matrix(matrix: Sequence[Sequence[float]], test_sizes: Sequence[int], spec: MetricSpec = ACCURACY,
                     offline: bool = False) -> dict[str, float | None]:
    """The summaries of one matrix, keyed by ``spec.column(summary)``; ``test_sizes[j] = n_j``."""
    R = _as_matrix(matrix, spec)
    T = R.shape[1]
    if len(test_sizes) != T:
        raise ValueError(f"{len(test_sizes)} test sizes for {T} test experiences.")
    scaled = lambda v: None if v is None else spec.scale * float(v)
    if offline:
        if R.shape[0] != 1:
            raise ValueError("an offline run has exactly one row (evaluated once, after training on everything).")
        values = {"avg_inc": None, "last": seen_accuracy(R, test_sizes, 0, T - 1), "forgetting": None, "bwt": None}
    else:
        if R.shape[0] != T:
            raise ValueError(f"{spec.name} matrix must be square (one row per training step), got {R.shape}.")
        A = [seen_accuracy(R, test_sizes, i) for i in range(T)]
        sign, best = (1.0, np.max) if spec.higher_is_better else (-1.0, np.min)
        old = range(T - 1)
        values = {"avg_inc": np.mean(A), "last": A[-1],
                  "forgetting": np.mean([sign * (best(R[: T - 1, j]) - R[T - 1, j]) for j in old]) if T > 1 else None,
                  "bwt": np.mean([R[T - 1, j] - R[j, j] for j in old]) if T > 1 else None}
    return {spec.column(k): scaled(v) for k, v in values.items()}


def summarize(matrices: Mapping[str, Sequence[Sequence[float]]], test_sizes: Sequence[int],
              specs: Sequence[MetricSpec], offline: bool = False) -> dict[str, float | None]:
    """Summaries of every matrix, one column per (spec, summary)."""
    missing = [s.name for s in specs if s.name not in matrices]
    if missing:
        raise ValueError(f"no matrix for metric(s) {missing}; got {sorted(matrices)}.")
    out: dict[str, float | None] = {}
    for spec in specs:
        out.update(summarize_matrix(matrices[spec.name], test_sizes, spec, offline))
    return out


__all__ = ["ACCURACY", "SUMMARIES", "MetricSpec", "primary", "seen_accuracy", "summarize", "summarize_matrix"]
