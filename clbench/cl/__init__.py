"""Shared continual-learning parts that strategies compose instead of copying.

- memories (:mod:`.memory` interface and registry; :mod:`.reservoir`, :mod:`.balanced`, :mod:`.herding`): one
  global budget ``K``, checked after every update; ``build_memory("herding", K)``.
- training phases (:mod:`.finetune`): :class:`Phase` and the balanced fine-tuning phase;
- the template setup (:mod:`.template`): :class:`PhasedTemplate`, Avalanche's ``SupervisedTemplate`` set up once
  for every strategy that trains in phases (DyTox, DER, PETL), and :class:`PhasedStrategy`, the strategy side of
  DyTox and DER; both imported from it on first use (``avalanche.training`` takes seconds to import, which a
  strategy without a template, such as TAFT or the sequence model, does not pay).
- batch mixing (:mod:`.mixing`): soft targets, label smoothing, MixUp.
- data loops (:mod:`.data`): experience -> DataLoader, tensors, features.
"""

from clbench.cl.balanced import ClassBalancedMemory, balanced_quotas
from clbench.cl.data import dataset_features, dataset_loader, experience_loader, experience_tensors
from clbench.cl.finetune import Phase, balanced_finetuning, freeze
from clbench.cl.herding import HerdingMemory, herding_order
from clbench.cl.memory import MEMORIES, BudgetExceeded, DatasetFeatures, Memory, build_memory, class_indices
from clbench.cl.mixing import label_smoothing, mix_lambda, mix_reversed, mixup, soft_targets
from clbench.cl.reservoir import Reservoir, ReservoirMemory

__all__ = [
    "MEMORIES", "BudgetExceeded", "ClassBalancedMemory", "DatasetFeatures", "HerdingMemory", "Memory", "Phase",
    "Reservoir", "ReservoirMemory", "balanced_finetuning", "balanced_quotas",
    "build_memory", "class_indices", "dataset_features", "dataset_loader", "experience_loader", "experience_tensors",
    "freeze", "herding_order", "label_smoothing", "mix_lambda", "mix_reversed", "mixup", "soft_targets",
]


def __getattr__(name: str):
    """:class:`PhasedStrategy` and :class:`PhasedTemplate`, from :mod:`.template` on first use."""
    if name in ("PhasedStrategy", "PhasedTemplate"):
        from clbench.cl import template

        return getattr(template, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
