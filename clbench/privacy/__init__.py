"""Differentially private training (Ding et al., ICML 2024; TAFT's private experiments).

- :func:`per_sample_grad_norms` — per-sample gradient norms without per-sample gradients (ghost / phantom clipping),
  from one forward and one backward; layer rules in :mod:`clbench.privacy.rules` (:func:`register_rule`) and, for
  the PETL modules, :mod:`clbench.privacy.petl_rules`.
  A parameter tied between an ``nn.Embedding`` and an ``nn.Linear`` (shared input/output embeddings) is clipped as
  one parameter, cross term included (phantom clipping, :mod:`clbench.privacy.tied`).
- :class:`PrivateTraining` — the ``dp`` callback: DP-SGD / DP-Adam step, Poisson batches, RDP accounting
  (:mod:`clbench.privacy.step`, :mod:`clbench.privacy.accountant`, :mod:`clbench.privacy.sampling`).
"""

from clbench.privacy import petl_rules  # noqa: F401 - registers the PETL modules' rules
from clbench.privacy.accountant import PrivacyBudgetError, epsilon, noise_multiplier
from clbench.privacy.rules import RULES, Call, Rule, UnsupportedLayerError, register_rule
from clbench.privacy.step import DPConfig, PrivateTraining
from clbench.privacy.tape import Tape, per_sample_grad_norms

__all__ = ["RULES", "Call", "DPConfig", "PrivacyBudgetError", "PrivateTraining", "Rule", "Tape",
           "UnsupportedLayerError", "epsilon", "noise_multiplier", "per_sample_grad_norms", "register_rule"]
