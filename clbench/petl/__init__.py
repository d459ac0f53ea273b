"""Parameter-efficient transfer learning in He et al.'s unified view (ICLR 2022) on timm ViTs.

- :mod:`.config`: :class:`Modification` (functional form, insertion, modified representation, composition),
  :class:`PETLConfig`, closed-form parameter counts;
- :mod:`.methods`: the methods by name (:data:`METHODS`: prefix, adapter_seq, adapter_par, scaled_par_adapter,
  mh_par_adapter, lora, mam; and the controls head_only and full_finetune);
- :mod:`.modules`: adapters, per-head adapters, LoRA, prefixes and one module set (:class:`PETLSet`);
- :mod:`.inject`: hooks in a frozen ViT (:func:`inject`), set switching, LoRA merge/unmerge;
- :mod:`.rules`: per-sample gradient norm rules of the modules (private training), registered on import.
"""

from clbench.petl import rules  # noqa: F401 - registers the modules' per-sample norm rules (clbench.privacy)
from clbench.petl.config import Modification, PETLConfig, ViTShape, modification_count
from clbench.petl.inject import PETLViT, Slot, inject
from clbench.petl.methods import METHODS, MethodArgs, build_method
from clbench.petl.modules import Adapter, LoRA, MultiHeadAdapter, PETLSet, PrefixBank

__all__ = ["METHODS", "Adapter", "LoRA", "MethodArgs", "Modification", "MultiHeadAdapter", "PETLConfig", "PETLSet",
           "PETLViT", "PrefixBank", "Slot", "ViTShape", "build_method", "inject", "modification_count"]
