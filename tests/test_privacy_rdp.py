"""clbench.privacy.rdp: the sampled Gaussian mechanism's RDP (integer orders, the fractional series) and its (ε, δ)
conversion, held to opacus's RDP accountant (the one clbench's runs use) within 1e-9 on a grid of (q, σ, steps, δ),
and the ε floor no noise multiplier gets under."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest

opacus = pytest.importorskip("opacus.accountants.utils")
from opacus.accountants import RDPAccountant  # noqa: E402

from clbench.privacy import rdp  # noqa: E402

GRID = list(itertools.product((1e-3, 0.02, 0.3, 1.0), (0.6, 1.1, 4.0), (1, 700), (1e-7, 1e-3)))


def _opacus_epsilon(history, delta):
    accountant = RDPAccountant()
    accountant.history = list(history)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order")
        return accountant.get_epsilon(delta=delta)


def test_the_orders_are_opacus_defaults():
    assert list(rdp.ORDERS) == list(RDPAccountant.DEFAULT_ALPHAS)


@pytest.mark.parametrize("q, sigma, steps, delta", GRID)
def test_epsilon_matches_opacus_within_1e9(q, sigma, steps, delta):
    expected = _opacus_epsilon([(sigma, q, steps)], delta)
    assert math.isclose(rdp.epsilon([(sigma, q, steps)], delta), expected, rel_tol=1e-9, abs_tol=1e-9)


def test_a_composition_matches_opacus_within_1e9():
    """RDP adds over mechanisms: a released statistic (σ_f, 1, 1) and two training calls composed."""
    history = [(3.0, 1.0, 1), (1.2, 0.05, 300), (0.9, 0.01, 1000)]
    assert math.isclose(rdp.epsilon(history, 1e-5), _opacus_epsilon(history, 1e-5), rel_tol=1e-9)


def test_the_edges_of_the_mechanism():
    """q = 0 spends nothing, σ = 0 everything, q = 1 is the plain Gaussian mechanism α / 2σ² per step."""
    assert rdp.rdp(0.0, 1.0, 10, 2.5) == 0.0
    assert rdp.rdp(0.5, 0.0, 10, 2.5) == math.inf
    assert rdp.rdp(1.0, 2.0, 10, 2.5) == 10 * 2.5 / 8


@pytest.mark.parametrize("delta", (1e-9, 1e-5, 1 / 1257))
def test_below_the_smallest_epsilon_opacus_finds_no_noise_and_just_above_it_does(delta):
    """The floor is where opacus's σ search (doubling up to 10⁶) gives up: 0.001 under it no σ reaches the target;
    0.01 over it one does, at few or many steps."""
    floor = rdp.smallest_epsilon(delta)
    for steps in (10, 100_000):
        with pytest.raises(ValueError):
            opacus.get_noise_multiplier(target_epsilon=floor - 1e-3, target_delta=delta, sample_rate=0.01,
                                        steps=steps, accountant="rdp")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Optimal order")
            assert opacus.get_noise_multiplier(target_epsilon=floor + 1e-2, target_delta=delta, sample_rate=0.01,
                                               steps=steps, accountant="rdp") > 0


@pytest.mark.parametrize("x", [0.5, 3.0, 24.9, 25.0, 25.5, 40.0])
def test_log_erfc_is_the_log_of_a_50_digit_erfc_on_both_sides_of_the_series_switch(x):
    """``_log_erfc`` below 25 (the library's erfc) and from 25 on (the asymptotic series to the u⁴ term, whose
    truncation error is below 4e-13 there) against mpmath's erfc at 50 digits, to 1e-12."""
    import mpmath

    with mpmath.workdps(50):
        expected = float(mpmath.log(mpmath.erfc(mpmath.mpf(x))))
    assert rdp._log_erfc(x) == pytest.approx(expected, rel=0, abs=1e-12)


def test_log_add_of_minus_infinity_is_the_other_term():
    """``log(e^a + e^b)`` with ``e^a = 0``: ``b``, also when both are 0 (no NaN from ``-inf - -inf``)."""
    assert rdp._log_add(-math.inf, 2.0) == 2.0 and rdp._log_add(2.0, -math.inf) == 2.0
    assert rdp._log_add(-math.inf, -math.inf) == -math.inf
    assert rdp._log_add(0.0, 0.0) == pytest.approx(math.log(2), rel=0, abs=1e-15)
