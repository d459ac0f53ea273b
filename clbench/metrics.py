"""Standardized continual-learning metrics, computed from the accuracy matrix only (never by a strategy).

Notation: ``R[i, j]`` is the accuracy (a fraction in [0, 1]) on test experience ``j`` after training experience
``i``, for ``i, j = 0 .. T-1``; ``n_j`` is the number of test samples of experience ``j``. All returned metrics are
percentages.

- ``A_i = sum_{j<=i} R[i, j] n_j / sum_{j<=i} n_j``   accuracy on all test data seen up to step ``i``
- ``avg_inc_acc = mean_i A_i``                          average incremental accuracy (DyTox's "Avg", Rebuffi et al.)
- ``last_acc = A_{T-1}``                                 accuracy on all test data after the last step ("Last")
- ``forgetting = mean_{j<T-1} (max_{i<T-1} R[i, j] - R[T-1, j])``        (Chaudhry et al., 2018)
- ``bwt = mean_{j<T-1} (R[T-1, j] - R[j, j])``                            (Lopez-Paz & Ranzato, 2017)
- ``fwt = mean_{j>0} (R[j-1, j] - b_j)`` where a scenario supplies reference accuracies ``b_j`` (same paper)

An offline run (joint training) has a single row, evaluated after training on everything: only ``last_acc`` is
defined and the other metrics are ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _as_matrix(accuracy_matrix: Sequence[Sequence[float]]) -> np.ndarray:
    R = np.asarray(accuracy_matrix, dtype=np.float64)
    if R.ndim != 2 or R.shape[1] == 0:
        raise ValueError(f"accuracy matrix must be 2-D with at least one column, got shape {R.shape}.")
    if np.isnan(R).any() or (R < 0).any() or (R > 1).any():
        raise ValueError("accuracy matrix entries must be fractions in [0, 1].")
    return R


def seen_accuracy(R: np.ndarray, test_sizes: Sequence[int], i: int, upto: int | None = None) -> float:
    """``A_i``: sample-weighted accuracy of row ``i`` over test experiences ``0..upto`` (default ``i``)."""
    upto = i if upto is None else upto
    n = np.asarray(test_sizes[: upto + 1], dtype=np.float64)
    return float((R[i, : upto + 1] * n).sum() / n.sum())


def summarize(accuracy_matrix: Sequence[Sequence[float]], test_sizes: Sequence[int], offline: bool = False,
              fwt_reference: Sequence[float] | None = None) -> dict[str, float | None]:
    """Metrics of one run, in percent. ``test_sizes[j] = n_j``."""
    R = _as_matrix(accuracy_matrix)
    T = R.shape[1]
    if len(test_sizes) != T:
        raise ValueError(f"{len(test_sizes)} test sizes for {T} test experiences.")
    pct = lambda v: None if v is None else 100.0 * float(v)
    if offline:
        if R.shape[0] != 1:
            raise ValueError("an offline run has exactly one row (evaluated once, after training on everything).")
        return {"avg_inc_acc": None, "last_acc": pct(seen_accuracy(R, test_sizes, 0, T - 1)),
                "forgetting": None, "bwt": None, "fwt": None}
    if R.shape[0] != T:
        raise ValueError(f"accuracy matrix must be square (one row per training step), got {R.shape}.")
    A = [seen_accuracy(R, test_sizes, i) for i in range(T)]
    old = range(T - 1)
    forgetting = np.mean([R[: T - 1, j].max() - R[T - 1, j] for j in old]) if T > 1 else None
    bwt = np.mean([R[T - 1, j] - R[j, j] for j in old]) if T > 1 else None
    fwt = None
    if fwt_reference is not None and T > 1:
        fwt = np.mean([R[j - 1, j] - fwt_reference[j] for j in range(1, T)])
    return {"avg_inc_acc": pct(np.mean(A)), "last_acc": pct(A[-1]), "forgetting": pct(forgetting),
            "bwt": pct(bwt), "fwt": pct(fwt)}
