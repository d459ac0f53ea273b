"""Noise calibration and privacy accounting (:mod:`clbench.privacy.accountant`), fast (no training): budgets refused
with their exact messages, σ calibrated and ε reported as opacus computes them."""

from __future__ import annotations

import math
import re
import sys
import warnings

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from clbench.petl import METHODS
from clbench.privacy.accountant import PrivacyBudgetError, epsilon, noise_multiplier
from clbench.privacy.step import DPConfig, PrivateTraining, check_private_strategy
from clbench.registry import STRATEGIES, load_plugins
from tests._dp_ledger import _ledger, refused  # noqa: F401 - _ledger: an autouse fixture


# ------------------------------------------------------------------------------------------------ budgets
@pytest.mark.parametrize("config, message", [
    ({}, "dp: give exactly one of epsilon (a target budget; the noise is calibrated) or noise_multiplier (sigma; "
         "epsilon is then reported)."),
    ({"epsilon": 3.0, "noise_multiplier": 1.0}, "dp: give exactly one of epsilon (a target budget; the noise is "
                                                "calibrated) or noise_multiplier (sigma; epsilon is then reported)."),
    ({"epsilon": 0.0}, "dp: epsilon must be a finite number > 0, got 0.0."),
    ({"epsilon": -1.0}, "dp: epsilon must be a finite number > 0, got -1.0."),
    ({"epsilon": math.inf}, "dp: epsilon must be a finite number > 0, got inf."),
    ({"epsilon": math.nan}, "dp: epsilon must be a finite number > 0, got nan."),
    ({"noise_multiplier": 0.0}, "dp: noise_multiplier must be a finite number > 0, got 0.0."),
    ({"noise_multiplier": math.inf}, "dp: noise_multiplier must be a finite number > 0, got inf."),
    ({"noise_multiplier": math.nan}, "dp: noise_multiplier must be a finite number > 0, got nan."),
    ({"epsilon": 3.0, "delta": 0.0}, "dp: delta must lie in (0, 1) (default 1/n), got 0.0."),
    ({"epsilon": 3.0, "delta": 1.0}, "dp: delta must lie in (0, 1) (default 1/n), got 1.0."),
    ({"epsilon": 3.0, "delta": 1.5}, "dp: delta must lie in (0, 1) (default 1/n), got 1.5."),
    ({"epsilon": 3.0, "clip": 0.0}, "dp: clip (the clipping norm R) must be > 0, got 0.0."),
    ({"epsilon": 3.0, "clip": math.inf}, "dp: clip (the clipping norm R) must be > 0, got inf."),
    ({"epsilon": 3.0, "clipping": "adaptive"}, "dp: clipping must be one of ['automatic', 'flat'], got 'adaptive'."),
    ({"epsilon": 3.0, "gamma": 0.0}, "dp: gamma (automatic clipping) must be > 0, got 0.0."),
    ({"epsilon": 3.0, "gamma": -0.5}, "dp: gamma (automatic clipping) must be > 0, got -0.5."),
])
def test_unusable_budgets_are_refused_with_the_exact_message(config, message):
    """Each refused budget (ε or σ missing or both, ε/σ not finite or ≤ 0, δ outside (0, 1), R ≤ 0 or infinite,
    unknown clipping, γ ≤ 0) raises the one line that says what to change; catches a weakened bound or an
    altered message."""
    with refused(message):
        DPConfig(**config)


@pytest.mark.parametrize("config", [
    {"epsilon": 0.5}, {"noise_multiplier": 0.5}, {"epsilon": 3.0, "delta": 0.5}, {"epsilon": 3.0, "delta": 1e-9},
    {"epsilon": 3.0, "delta": 0.999}, {"epsilon": 3.0, "clip": 0.5}, {"epsilon": 3.0, "gamma": 0.5},
    {"epsilon": 3.0, "clipping": "automatic"},
])
def test_usable_budgets_near_the_bounds_are_accepted(config):
    """Values just inside each bound (ε, σ, R, γ in (0, 1); δ near 0 and 1; automatic clipping) pass; catches a
    bound tightened to ≥ 1 or a closed interval."""
    assert DPConfig(**config) == DPConfig(**{**{"epsilon": None}, **config})


def test_dp_arguments_reach_the_budget_in_order_with_the_documented_defaults():
    """``dp`` callback arguments map to DPConfig fields one to one, defaults R = 1, flat clipping, γ = 0.01, δ and σ
    unset; catches a swapped argument or a changed default."""
    assert PrivateTraining(epsilon=3.0).config == DPConfig(epsilon=3.0, delta=None, clip=1.0, clipping="flat",
                                                           noise_multiplier=None, gamma=0.01)
    assert PrivateTraining(None, 1e-4, 2.0, "automatic", 1.5, 0.5).config == DPConfig(
        epsilon=None, delta=1e-4, clip=2.0, clipping="automatic", noise_multiplier=1.5, gamma=0.5)


def test_strategies_that_reuse_samples_are_refused_and_private_ones_accepted():
    """The strategies whose class declares ``private = True`` (the contract's attribute): the seven built-in ones
    and every PETL method's shared and ``_merge`` strategies, not ``_per_task`` (noise-free prototypes); replay and
    a per-task PETL strategy are refused with the exact line listing them; each listed one is accepted; catches an
    inverted check, a missing or extra declaration or an altered message."""
    load_plugins()
    petl = {method + variant for method in METHODS.names() for variant in ("", "_merge")}
    expected = sorted({"model_soup", "naive", "nlft", "seqrec", "sisa", "taft", "taft_shards"} | petl)
    assert sorted(n for n in STRATEGIES.names() if STRATEGIES.get(n).private) == expected
    assert STRATEGIES.get("lora_per_task").private is False
    for name in expected:
        check_private_strategy(name)
    for name in ("replay", "lora_per_task"):
        with refused(f"dp: strategy {name!r} is not known to use each sample in one training call only, so its "
                      f"epsilon cannot be accounted; private strategies: {', '.join(expected)}."):
            check_private_strategy(name)


# ------------------------------------------------------------------------------------------------ accountant
def test_epsilon_of_a_history_is_opacus_rdp_composition():
    """ε of two composed (σ, q, steps) calls equals opacus's RDPAccountant stepped through the same calls (ints and
    tensors accepted as numbers); catches a dropped call, swapped fields or a wrong δ."""
    reference = RDPAccountant()
    for sigma, q, steps in [(0.9, 0.01, 300), (1.4, 0.05, 40)]:
        for _ in range(steps):
            reference.step(noise_multiplier=sigma, sample_rate=q)
    f64 = torch.float64
    history = [(torch.tensor(0.9, dtype=f64), 0.01, 300), (1.4, torch.tensor(0.05, dtype=f64), torch.tensor(40))]
    assert epsilon(history, 1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    assert epsilon(history, 1e-3) < epsilon(history, 1e-5)


def test_noise_multiplier_is_opacus_calibration_and_meets_the_budget():
    """σ for (ε = 3, δ = 1e-5, q = 0.01, 1000 steps) is opacus's RDP search result (0.8655 in STACK_NOTES) and its
    ε lands within opacus's tolerance below the target; catches another accountant or a rounded σ."""
    sigma = noise_multiplier(3.0, 1e-5, 0.01, 1000)
    assert sigma == get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.01, steps=1000,
                                         accountant="rdp")
    assert sigma == pytest.approx(0.8655, abs=1e-3)
    assert 2.98 < epsilon([(sigma, 0.01, 1000)], 1e-5) <= 3.0


def test_an_unreachable_epsilon_is_refused_naming_the_schedule():
    """No σ reaches ε = 1e-9: the refusal names ε, δ, steps and rate and says what to change."""
    with pytest.raises(PrivacyBudgetError, match=re.escape(
            "dp: no noise multiplier reaches epsilon=1e-09 at delta=1e-05 for 50 steps at sampling rate 0.1 "
            "(opacus: ") + ".+" + re.escape("); raise epsilon or train fewer steps.")):
        noise_multiplier(1e-9, 1e-5, 0.1, 50)


def test_a_release_beside_the_steps_is_composed_into_the_calibration_or_refused_when_it_spends_the_budget():
    """A Gaussian release (σ_f = 3, q = 1, one step) of the same data beside ε = 3, δ = 1e-5, q = 0.01, 1000 steps:
    the composition's ε lands within the 0.01 tolerance below the budget, with a larger σ than without the
    release; a release that alone spends ε = 1 is refused with the exact line; catches a release left out of the
    calibration, a search that overshoots the budget or stops far below it."""
    releases = ((3.0, 1.0, 1),)
    sigma = noise_multiplier(3.0, 1e-5, 0.01, 1000, releases)
    assert 2.99 <= epsilon([(sigma, 0.01, 1000), *releases], 1e-5) <= 3.0
    assert sigma > noise_multiplier(3.0, 1e-5, 0.01, 1000)
    two = ((3.0, 1.0, 1), (4.5, 1.0, 1))
    alone = epsilon(two, 1e-5)
    assert 1.0 < alone < 3.0
    with refused(f"dp: the mechanisms already applied to this data (released statistics, earlier training calls "
                  f"on the same samples; noise multipliers 3, 4.5) alone spend epsilon={alone:.3g} of the budget 1.0 "
                  f"at delta=1e-05; give them more noise or raise epsilon."):
        noise_multiplier(1.0, 1e-5, 0.01, 1000, two)


def test_applied_mechanisms_that_spend_exactly_the_budget_are_refused_as_such(monkeypatch):
    """ε already spent = the budget: refused as spent (the search would have nothing left to find)."""
    from clbench.privacy import accountant

    monkeypatch.setattr(accountant, "epsilon", lambda history, delta: 1.0)
    with refused("dp: the mechanisms already applied to this data (released statistics, earlier training calls on "
                  "the same samples; noise multipliers 3) alone spend epsilon=1 of the budget 1.0 at delta=1e-05; "
                  "give them more noise or raise epsilon."):
        noise_multiplier(1.0, 1e-5, 0.1, 50, ((3.0, 1.0, 1),))


def test_the_composed_search_keeps_the_accountants_order_warning_to_itself():
    """At ε = 100 the search probes σ where opacus warns "Optimal order is the smallest alpha"; the search
    silences it (the run's reported ε still warns), so no warning escapes; catches a filter that no longer matches."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sigma = noise_multiplier(100.0, 1e-5, 0.1, 50, ((3.0, 1.0, 1),))
    assert 0.2 < sigma < 0.4


def test_the_composed_search_brackets_sigma_above_its_first_guess():
    """A tight budget (ε = 0.5 for 100 steps at q = 0.5, beside a release σ_f = 60 that spends ε ≈ 0.11) needs
    σ > 10, the search's first upper bound: it doubles the bracket and still lands within the tolerance; catches a
    search that stops at its first bracket."""
    releases = ((60.0, 1.0, 1),)
    sigma = noise_multiplier(0.5, 1e-5, 0.5, 100, releases)
    assert sigma > 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert 0.49 <= epsilon([(sigma, 0.5, 100), *releases], 1e-5) <= 0.5


def test_a_composed_budget_no_sigma_reaches_is_refused_instead_of_searching_forever(monkeypatch):
    """If even σ = 10·2^64 left the composition above the budget (an accountant that never falls below it), the
    search stops with the exact line instead of doubling forever; catches an unbounded or silent search."""
    from clbench.privacy import accountant

    monkeypatch.setattr(accountant, "epsilon", lambda history, delta: 0.5 if len(history) == 1 else 2.0)
    with refused(f"dp: no noise multiplier up to {10 * 2.0**64:g} reaches epsilon=1.0 at delta=1e-05 for 50 steps "
                  f"at sampling rate 0.1 beside the mechanisms already applied (epsilon=0.5); raise epsilon."):
        noise_multiplier(1.0, 1e-5, 0.1, 50, ((3.0, 1.0, 1),))


def test_without_opacus_the_accountant_says_which_extra_to_install(monkeypatch):
    """opacus missing: the exact line naming the dp extra (not an ImportError from deep inside)."""
    monkeypatch.setitem(sys.modules, "opacus.accountants.utils", None)
    with refused("dp: private training needs opacus for its accountant; install the dp extra: "
                  "pip install 'clbench[dp]'."):
        epsilon([(1.0, 0.1, 10)], 1e-5)
