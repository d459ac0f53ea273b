"""Rényi DP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar & Zhang 2019, "Rényi Differential Privacy
of the Sampled Gaussian Mechanism") and its conversion to (ε, δ), in plain Python (no torch, no numpy), so that the
suite loader can tell an impossible budget before any heavy import. The runs' accountant is opacus's
(:mod:`clbench.privacy.accountant`); the tests hold these formulas to it within 1e-9.

One step: sampling rate ``q``, noise multiplier ``σ``; ``μ₀ = N(0, σ²)``, ``μ₁ = N(1, σ²)``,
``μ = (1 − q) μ₀ + q μ₁``. Its RDP at order ``α`` is ``ε(α) = log A_α / (α − 1)`` with
``A_α = E_{z∼μ₀}[(μ(z) / μ₀(z))^α]``:

- integer ``α`` (binomial expansion of ``(1 − q + q·μ₁/μ₀)^α``, ``E_{μ₀}[(μ₁/μ₀)^k] = exp((k² − k) / 2σ²)``)::

      A_α = Σ_{k=0}^{α} C(α, k) (1 − q)^{α−k} q^k exp((k² − k) / 2σ²)

- fractional ``α``: split the integral at ``z₀ = σ² log(1/q − 1) + 1/2``, where ``(1 − q) μ₀ = q μ₁``, and expand
  ``μ^α`` in powers of the smaller term on each side (a convergent series)::

      A_α = Σ_{i≥0} C(α, i) (1 − q)^{α−i} q^i     exp((i² − i) / 2σ²) · ½ erfc((i − z₀) / (√2 σ))
          + Σ_{i≥0} C(α, i) q^{α−i} (1 − q)^i     exp((j² − j) / 2σ²) · ½ erfc((z₀ − j) / (√2 σ)),   j = α − i

  (``C(α, i)`` the generalized binomial coefficient, negative for some ``i > α``).

Composition over ``steps`` (and over several mechanisms) adds RDP; at ``δ`` (Balle et al. 2020, Theorem 21, the
conversion opacus's RDP accountant makes, over its orders :data:`ORDERS`)::

      ε = min_α  Σ ε(α) − (log δ + log α) / (α − 1) + log((α − 1) / α)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

ORDERS: tuple[float, ...] = (*(1 + x / 10 for x in range(1, 100)), *map(float, range(12, 64)))
"""The RDP orders ``α`` the conversion minimizes over: opacus's RDPAccountant's default ones, so that both give the
same ε (clbench's runs are accounted by opacus with those orders)."""

SERIES_DEPTH = 36.0
"""The fractional series stops past ``i > α`` once both terms are below ``e^-SERIES_DEPTH`` times the sum so far."""
MAX_TERMS = 1_000_000


def _log_add(a: float, b: float) -> float:
    """``log(e^a + e^b)``."""
    if a == -math.inf:
        return b
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


def _log_erfc(x: float) -> float:
    """``log erfc(x)``; beyond ``x = 25`` (erfc near the smallest double) from the asymptotic series
    ``erfc(x) = e^{-x²} / (x√π) · (1 − 1/(2x²) + 3/(2x²)² − 15/(2x²)³ + 105/(2x²)⁴)``."""
    if x < 25:
        return math.log(math.erfc(x))
    u = 1 / (2 * x * x)
    return -x * x - math.log(x * math.sqrt(math.pi)) + math.log1p(-u + 3 * u ** 2 - 15 * u ** 3 + 105 * u ** 4)


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """``log A_α`` for an integer ``α`` (the finite binomial sum)."""
    total = -math.inf
    for k in range(alpha + 1):
        log_binomial = math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
        total = _log_add(total, log_binomial + k * math.log(q) + (alpha - k) * math.log1p(-q)
                         + (k * k - k) / (2 * sigma ** 2))
    return total


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """``log A_α`` for a fractional ``α`` (the two series at ``z₀``, summed with their signs)."""
    z0 = sigma ** 2 * math.log(1 / q - 1) + 0.5
    log_q, log_1q, scale = math.log(q), math.log1p(-q), math.sqrt(2) * sigma
    positive, negative = -math.inf, -math.inf         # log of the sums of the positive and negative terms
    log_binomial, sign = 0.0, 1.0                     # log |C(α, i)| and its sign, from C(α, i+1) = C(α, i)(α−i)/(i+1)
    for i in range(MAX_TERMS):
        j = alpha - i
        first = (log_binomial + i * log_q + j * log_1q + (i * i - i) / (2 * sigma ** 2)
                 + math.log(0.5) + _log_erfc((i - z0) / scale))
        second = (log_binomial + j * log_q + i * log_1q + (j * j - j) / (2 * sigma ** 2)
                  + math.log(0.5) + _log_erfc((z0 - j) / scale))
        term = _log_add(first, second)
        if sign > 0:
            positive = _log_add(positive, term)
        else:
            negative = _log_add(negative, term)
        if i > alpha and term < positive - SERIES_DEPTH:
            break
        log_binomial += math.log(abs(alpha - i)) - math.log(i + 1)
        sign *= math.copysign(1.0, alpha - i)
    else:
        raise ArithmeticError(f"the RDP series at order {alpha} did not converge in {MAX_TERMS} terms")
    return positive + math.log1p(-math.exp(negative - positive)) if negative > -math.inf else positive


def rdp(q: float, sigma: float, steps: int, alpha: float) -> float:
    """RDP at order ``α`` of ``steps`` steps of the sampled Gaussian mechanism (rate ``q``, noise multiplier ``σ``)."""
    if q == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if q == 1:
        return steps * alpha / (2 * sigma ** 2)
    log_a = _log_a_integer(q, sigma, int(alpha)) if float(alpha).is_integer() else _log_a_fractional(q, sigma, alpha)
    return steps * log_a / (alpha - 1)


def _converted(alpha: float, spent: float, delta: float) -> float:
    """ε at ``δ`` from RDP ``spent`` at order ``α`` (Balle et al. 2020, Theorem 21)."""
    return spent - (math.log(delta) + math.log(alpha)) / (alpha - 1) + math.log((alpha - 1) / alpha)


def epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of the composition of ``history`` = ``[(σ, q, steps), ...]``, minimized over :data:`ORDERS`."""
    return min(_converted(a, sum(rdp(q, s, n, a) for s, q, n in history), delta) for a in ORDERS)


def smallest_epsilon(delta: float) -> float:
    """The ε no noise reaches at ``delta``: the limit of :func:`epsilon` as ``σ → ∞`` (RDP 0 at every order), a floor
    set by ``δ`` and the largest order alone, below which every noise multiplier search fails, whatever the steps
    and sampling rate."""
    return min(_converted(a, 0.0, delta) for a in ORDERS)


__all__ = ["ORDERS", "epsilon", "rdp", "smallest_epsilon"]
