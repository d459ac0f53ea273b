"""Noise calibration and privacy accounting through opacus's RDP accountant (Mironov 2017; Mironov, Talwar & Zhang
2019 for the Poisson-subsampled Gaussian mechanism) — a dependency, not a re-implementation.

A private training call is the subsampled Gaussian mechanism applied ``steps`` times with sampling rate ``q``
(Poisson: each sample enters each step's batch independently with probability ``q``) and noise multiplier ``σ``
(noise ``N(0, σ²R²)`` on the sum of clipped gradients, ``R`` the clipping norm). :func:`noise_multiplier` finds the
smallest ``σ`` (opacus's binary search, tolerance 0.01 in ε) whose ``(ε, δ)`` after those steps is within budget;
:func:`epsilon` reports the ε of a history of such calls composed (RDP composition, converted at ``δ``).

Mechanisms already applied to the same data, ``applied = ((σ', q', steps'), ...)``, are composed with the call:
a statistic released once before training with the Gaussian mechanism (noise ``N(0, σ_f² Δ²)`` on a statistic of
L2 sensitivity ``Δ``; e.g. Re-Attention's token-frequency prior) is the entry ``(σ_f, 1, 1)`` (sampling rate 1, one
step), and earlier training calls on the same samples are their own ``(σ, q, steps)``. :func:`noise_multiplier`
given them calibrates the call's ``σ`` for the composition: the same doubling-then-bisection search as opacus's, on
opacus's ε of ``[(σ, q, steps), *applied]``. (Calls still to come with the same schedule are ``steps`` times their
number: RDP adds over steps.)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import lru_cache

from clbench.privacy.config import PrivacyBudgetError


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
def noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int,
                     applied: tuple[tuple[float, float, int], ...] = ()) -> float:
    """``σ`` such that ``steps`` Poisson-subsampled Gaussian steps at rate ``sample_rate``, composed with the
    mechanisms ``applied`` ``((σ', q', steps'), ...)`` to the same data, spend at most ``(epsilon, delta)`` under
    the RDP accountant (cached: opacus's search takes seconds, and the experiences of a run usually share one
    schedule)."""
    if applied:
        return _composed_noise_multiplier(epsilon, delta, sample_rate, steps, applied)
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


DOUBLINGS, BISECTIONS = 64, 100
"""The composed search doubles σ from 10 at most ``DOUBLINGS`` times (then refuses the budget) and halves the bracket
at most ``BISECTIONS`` times (far more than the tolerance needs; σ stays within budget throughout)."""


def _composed_noise_multiplier(target: float, delta: float, sample_rate: float, steps: int,
                               applied: tuple[tuple[float, float, int], ...], tolerance: float = 0.01) -> float:
    """The smallest ``σ`` (to ``tolerance`` in ε, from below) with ``ε([(σ, q, steps), *applied]) ≤ target``;
    refused when the mechanisms already applied spend the target."""
    spent_before = epsilon(applied, delta)
    if spent_before >= target:
        raise PrivacyBudgetError(f"dp: the mechanisms already applied to this data (released statistics, earlier "
                                 f"training calls on the same samples; noise multipliers "
                                 f"{', '.join(f'{s:g}' for s, _, _ in applied)}) alone spend epsilon="
                                 f"{spent_before:.3g} of the budget {target} at delta={delta:.3g}; give them more "
                                 f"noise or raise epsilon.")

    def spent(sigma: float) -> float:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Optimal order is the (largest|smallest) alpha")
            return epsilon([(sigma, sample_rate, steps), *applied], delta)

    low, high = 0.0, 10.0
    for _ in range(DOUBLINGS):                   # as σ grows, the composition's ε falls to spent_before < target
        if spent(high) <= target:
            break
        low, high = high, 2 * high
    else:
        raise PrivacyBudgetError(f"dp: no noise multiplier up to {high:g} reaches epsilon={target} at "
                                 f"delta={delta:.3g} for {steps} steps at sampling rate {sample_rate:.4g} beside "
                                 f"the mechanisms already applied (epsilon={spent_before:.3g}); raise epsilon.")
    for _ in range(BISECTIONS):                  # invariant: high is within budget, low is not (or 0)
        if target - spent(high) <= tolerance:
            break
        middle = (low + high) / 2
        low, high = (middle, high) if spent(middle) > target else (low, middle)
    return high


def epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of the composition of ``history`` = ``[(σ, q, steps), ...]`` (opacus's RDPAccountant)."""
    accountant = _opacus().RDPAccountant()
    accountant.history = [(float(s), float(q), int(n)) for s, q, n in history]
    return float(accountant.get_epsilon(delta=delta))


__all__ = ["PrivacyBudgetError", "epsilon", "noise_multiplier"]
