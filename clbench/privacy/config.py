"""A private training budget (:class:`DPConfig`, the ``dp`` callback's arguments) and its rules, without torch: the
suite loader checks ``dp:`` entries from here before any heavy import (:mod:`clbench.suite_file`).

Each field declares its range and choices as field metadata (:func:`clbench.typecheck.setting`, as a strategy's
Config does): ``ε > 0``, ``δ ∈ (0, 1)``, clipping norm ``R > 0`` (``R = 0`` clips every gradient to nothing),
``σ > 0``, clipping ``flat | automatic`` and automatic clipping's ``γ > 0``, used only with ``clipping: automatic``.
:meth:`DPConfig.__post_init__` reads those declarations (and finiteness: a budget of ``inf`` is no budget), and
checks the one rule no declaration can say: exactly one of ``epsilon`` and ``noise_multiplier``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clbench.privacy.rdp import smallest_epsilon
from clbench.typecheck import POSITIVE, Range, declarations, only_with, setting


def not_private(strategy: str, private: list[str]) -> PrivacyBudgetError:
    """The refusal of ``dp`` for ``strategy``, whose class does not declare ``private = True``; ``private``: the
    strategies that do (the same line from :func:`clbench.privacy.step.check_private_strategy`, after the imports,
    and from the registries' index, before them)."""
    return PrivacyBudgetError(f"dp: strategy {strategy!r} is not known to use each sample in one training call only, "
                              f"so its epsilon cannot be accounted; private strategies: {', '.join(private)}.")


class PrivacyBudgetError(ValueError):
    """A privacy budget that cannot be used (ε ≤ 0, δ ∉ (0, 1), clip ≤ 0, no ε or σ given, or no σ reaches ε);
    raised before training with a message saying what to change."""


CLIPPING_MODES = ("automatic", "flat")
"""The clipping factors :data:`clbench.privacy.step.CLIPPING` computes (its keys; a test keeps them equal)."""


@dataclass(frozen=True)
class DPConfig:
    """A privacy budget: target ``epsilon`` (or a fixed ``noise_multiplier`` σ instead), ``delta`` (None: 1/n),
    clipping norm ``clip`` (R), ``clipping`` (flat | automatic) and automatic clipping's ``gamma``."""

    epsilon: float | None = setting(None, within=POSITIVE)
    delta: float | None = setting(None, within=Range(0, 1, open_low=True, open_high=True))
    clip: float = setting(1.0, within=POSITIVE)
    clipping: str = setting("flat", choices=CLIPPING_MODES)
    noise_multiplier: float | None = setting(None, within=POSITIVE)
    gamma: float = setting(0.01, within=POSITIVE, only_with=only_with("clipping", "automatic"))

    def __post_init__(self) -> None:
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise PrivacyBudgetError("dp: give exactly one of epsilon (a target budget; the noise is calibrated) "
                                     "or noise_multiplier (sigma; epsilon is then reported).")
        for name, declared in DECLARED.items():
            value = getattr(self, name)
            if declared.within is not None and value is not None and not (
                    isinstance(value, (int, float)) and math.isfinite(value) and value in declared.within):
                raise PrivacyBudgetError(f"dp: {REFUSALS[name]}, got {value}.")
            if declared.choices is not None and value not in declared.choices:
                raise PrivacyBudgetError(f"dp: {name} must be one of {sorted(declared.choices)}, got {value!r}.")


DECLARED = declarations(DPConfig)
"""``{field: Declared}`` of :class:`DPConfig`: the declarations the ``dp`` callback's parameters carry too."""

REFUSALS: dict[str, str] = {
    "epsilon": "epsilon must be a finite number > 0",
    "noise_multiplier": "noise_multiplier must be a finite number > 0",
    "delta": "delta must lie in (0, 1) (default 1/n)",
    "clip": "clip (the clipping norm R) must be > 0",
    "gamma": "gamma (automatic clipping) must be > 0",
}
"""What a value outside a field's declared range (or not finite) is told, in words."""


def check_reachable(config: DPConfig, n_train: int | None, stream: str = "the stream") -> None:
    """Refuse a target ε that no noise multiplier reaches at the run's δ (``config.delta``, else ``1/n_train`` with
    ``n_train`` the training samples of ``stream``; neither known: nothing to check here, the run's calibration
    refuses it): below :func:`clbench.privacy.rdp.smallest_epsilon` (the RDP accountant's ε as ``σ → ∞``, which
    no number of steps or sampling rate lowers), every calibration fails. (Between that floor and ε at the largest
    σ the calibration tries, a band under 1e-4 wide, the run refuses it when it calibrates.)"""
    if config.epsilon is None or config.delta is None and not n_train:
        return
    delta = config.delta if config.delta is not None else 1 / n_train
    floor = smallest_epsilon(delta)
    if config.epsilon <= floor:
        at = f"delta={delta:.3g}" if config.delta is not None else f"delta=1/n={delta:.3g} ({n_train:,} training " \
                                                                   f"samples in {stream})"
        raise PrivacyBudgetError(f"dp: no noise multiplier reaches epsilon={config.epsilon:g} at {at}: the RDP "
                                 f"accountant's epsilon there is above {floor:.4g} however much noise is added; set "
                                 f"epsilon above {floor:.4g}, or raise delta.")


__all__ = ["CLIPPING_MODES", "DECLARED", "DPConfig", "PrivacyBudgetError", "REFUSALS", "check_reachable",
           "not_private"]
