"""Noise calibration and privacy accounting through opacus's RDP accountant (Mironov 2017; Mironov, Talwar & Zhang
2019 for the Poisson-subsampled Gaussian mechanism) — a dependency, not a re-implementation.

A private training call is the subsampled Gaussian mechanism applied ``steps`` times with sampling rate ``q``
(Poisson: each sample enters each step's batch independently with probability ``q``) and noise multiplier ``σ``
(noise ``N(0, σ²R²)`` on the sum of clipped gradients, ``R`` the clipping norm). :func:`noise_multiplier` finds the
smallest ``σ`` (opacus's binary search, tolerance 0.01 in ε) whose ``(ε, δ)`` after those steps is within budget;
:func:`epsilon` reports the ε of a history of such calls composed (RDP composition, converted at ``δ``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import lru_cache


class PrivacyBudgetError(ValueError):
    """A privacy budget that cannot be used (ε ≤ 0, δ ∉ (0, 1), clip ≤ 0, no ε or σ given, or no σ reaches ε);
    raised before training with a message saying what to change."""


def _opacus():
    """opacus's accountants, imported on first use: the ``dp`` extra is needed for private runs only (the models and
    Re-Attention of :mod:`clbench.privacy` import without it)."""
    try:
        import opacus.accountants.utils
    except ImportError:
        raise PrivacyBudgetError("dp: private training needs opacus for its accountant; install the dp extra: "
                                 "pip install 'clbench[dp]'.") from None
    return opacus.accountants


@lru_cache(maxsize=256)
def noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """``σ`` such that ``steps`` Poisson-subsampled Gaussian steps at rate ``sample_rate`` spend at most
    ``(epsilon, delta)`` under the RDP accountant (cached: opacus's search takes seconds, and the experiences of a
    run usually share one schedule)."""
    get_noise_multiplier = _opacus().utils.get_noise_multiplier
    try:
        with warnings.catch_warnings():
            # the search brackets sigma from 20 upwards, where the tiny epsilon's optimal RDP order is the largest
            # one; opacus warns for each such probe. The epsilon reported for the run (epsilon()) still warns.
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
            return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                              steps=steps, accountant="rdp"))
    except ValueError as exc:
        raise PrivacyBudgetError(f"dp: no noise multiplier reaches epsilon={epsilon} at delta={delta:.3g} for "
                                 f"{steps} steps at sampling rate {sample_rate:.4g} (opacus: {exc}); raise epsilon "
                                 f"or train fewer steps.") from None


def epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of the composition of ``history`` = ``[(σ, q, steps), ...]`` (opacus's RDPAccountant)."""
    accountant = _opacus().RDPAccountant()
    accountant.history = [(float(s), float(q), int(n)) for s, q, n in history]
    return float(accountant.get_epsilon(delta=delta))


__all__ = ["PrivacyBudgetError", "epsilon", "noise_multiplier"]
