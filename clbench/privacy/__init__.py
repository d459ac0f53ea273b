"""Differentially private training (Ding et al., ICML 2024; TAFT's private experiments).

- :func:`per_sample_grad_norms` — per-sample gradient norms without per-sample gradients (ghost / phantom clipping),
  from one forward and one backward; layer rules in :mod:`clbench.privacy.rules` (:func:`register_rule`), for
  ``nn.MultiheadAttention`` (and so torch's transformer layers) in :mod:`clbench.privacy.attention`, and for bare
  parameters added or concatenated to activations (positional tables, class tokens) in :mod:`clbench.privacy.bare`.
  The packages that own other layers register theirs (:mod:`clbench.tangent.rules`, :mod:`clbench.petl.rules`,
  :mod:`clbench.models.vit`) when they are imported; this package imports none of them.
  A parameter with several uses — tied between an ``nn.Embedding`` and an ``nn.Linear`` (shared input/output
  embeddings), or a layer's weight also used bare in a matrix product (GPT-2/BERT heads) — is clipped as one
  parameter, cross terms included (phantom clipping, :mod:`clbench.privacy.tied`); :mod:`clbench.privacy.uses`
  follows what no layer sees (those products, layer outputs broadcast over the batch such as nanoGPT's positions);
  :func:`rows_of` (:mod:`clbench.privacy.packing`) lets a model call a layer on rows of several samples with each
  row's sample (packed rows). The first-step invariant (:meth:`Tape.explain`): the rules must explain every
  parameter's whole gradient, or the run stops naming the parameter.
- :class:`PrivateTraining` — the ``dp`` callback: DP-SGD / DP-Adam step, Poisson batches, RDP accounting
  (:mod:`clbench.privacy.step`, :mod:`clbench.privacy.accountant`, :mod:`clbench.privacy.sampling`); its budget
  :class:`DPConfig` (:mod:`clbench.privacy.config`) and the RDP formulas (:mod:`clbench.privacy.rdp`) import no
  torch, and nor does this package: its other names are imported on first use, and the modules that read the layer
  rules (:mod:`clbench.privacy.tape`) import the attention and bare-parameter rules themselves.
"""

from importlib import import_module

from clbench.privacy.config import DPConfig, PrivacyBudgetError

_LAZY = {"epsilon": "accountant", "noise_multiplier": "accountant", "rows_of": "packing", "RULES": "rules",
         "Call": "rules", "Rule": "rules", "UnsupportedLayerError": "rules", "register_rule": "rules",
         "PrivateTraining": "step", "Tape": "tape", "per_sample_grad_norms": "tape"}
"""The names this package gives, imported with their module on first use: the budget (:mod:`clbench.privacy.config`)
imports no torch, so the suite loader reads it before the heavy imports."""


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'clbench.privacy' has no attribute {name!r}")
    import_module("clbench.privacy.attention")       # torch's attention rules, with the first torch-side name
    value = getattr(import_module(f"clbench.privacy.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = ["RULES", "Call", "DPConfig", "PrivacyBudgetError", "PrivateTraining", "Rule", "Tape",
           "UnsupportedLayerError", "epsilon", "noise_multiplier", "per_sample_grad_norms", "register_rule", "rows_of"]
