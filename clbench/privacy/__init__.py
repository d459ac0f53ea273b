"""Differentially private training (Ding et al., ICML 2024; TAFT's private experiments).

- :func:`per_sample_grad_norms` — per-sample gradient norms without per-sample gradients (ghost / phantom clipping),
  from one forward and one backward; layer rules in :mod:`clbench.privacy.rules` (:func:`register_rule`).
- :class:`TiedEmbedding` — a shared input/output embedding clipped as one parameter; :class:`LearnedPositions`.
"""

from clbench.privacy.rules import RULES, Call, Rule, UnsupportedLayerError, register_rule
from clbench.privacy.tape import Tape, per_sample_grad_norms
from clbench.privacy.tied import LearnedPositions, TiedEmbedding

__all__ = ["RULES", "Call", "LearnedPositions", "Rule", "Tape", "TiedEmbedding", "UnsupportedLayerError",
           "per_sample_grad_norms", "register_rule"]
