"""The PETL methods by name: :data:`METHODS` maps a name to a factory ``MethodArgs -> PETLConfig``.

Every strategy in :mod:`clbench.strategies.petl` (``<method>``, ``<method>_per_task``, ``<method>_merge``) is
generated from this registry, so adding a method here adds its three strategies. Two entries are the family's
controls, not PETL methods: ``head_only`` (frozen backbone, no module: a linear probe) and ``full_finetune`` (every
backbone weight trained); they read no size setting.

Defaults (:class:`MethodArgs`, a field left ``None`` takes the method's default): the MAM adapter's sizes from He
et al. (prefix ``l = 30`` reparametrized by an MLP of width 512, FFN scaled parallel adapter ``r = 512``, ``s = 4``:
at their ``d = 1024`` the prefix is about 5% of MAM's parameters) for the prefix and adapter methods; LoRA ``r = 8``,
``α = 16`` (``s = α/r = 2``, a common LoRA setting, not a value from the unified-view paper). These are
mBART-large-scale sizes: CPU runs set ``size`` (and ``prefix_length`` for MAM) for their ViT (see
``clbench/suites/petl.yaml``). Each method declares the fields it reads (:func:`unused_fields` lists the ones set but
not read, which the strategies refuse at load).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from clbench.petl.config import Modification, PETLConfig
from clbench.registry import Registry
from clbench.typecheck import AT_LEAST_1, NON_NEGATIVE, POSITIVE, RangeChecked, setting

PLACEMENTS = {"attn": ("attn",), "ffn": ("ffn",), "both": ("attn", "ffn")}
DEFAULTS = {"scale": 4.0, "lora_alpha": 16.0, "prefix_reparam": 512, "prefix_length": 30}


@dataclass
class MethodArgs(RangeChecked):
    """Sizes and placements shared by every method; ``None``: the method's default. Each factory reads only the fields
    it declares (:func:`method`)."""

    size: int | None = setting(None, within=AT_LEAST_1)            # r (adapters, LoRA) or l (prefix)
    placement: str | None = setting(None, choices=sorted(PLACEMENTS))   # adapters and LoRA: attn | ffn | both
    #                                    (Houlsby: both; parallel: ffn; LoRA: attn)
    scale: float | None = setting(None, within=POSITIVE)          # s of the scaled parallel adapter (and MAM's); 4
    lora_alpha: float | None = setting(None, within=POSITIVE)     # LoRA's s = α / r; default 16
    prefix_reparam: int | None = setting(None, within=NON_NEGATIVE)   # hidden width k of the prefix MLP, merged
    #                                    after training; 0: free prefix vectors; default 512
    prefix_length: int | None = setting(None, within=AT_LEAST_1)   # l of MAM's prefix; default 30

    def get(self, name: str, default=None):
        """The field's value, or ``default`` (else :data:`DEFAULTS`) when it is ``None``."""
        value = getattr(self, name)
        return value if value is not None else (default if default is not None else DEFAULTS[name])


METHODS: Registry[Callable[[MethodArgs], PETLConfig]] = Registry("PETL method")


def method(name: str, reads: tuple[str, ...], cpu: dict | None = None):
    """Registers a factory under ``name`` that reads the :class:`MethodArgs` fields ``reads``; ``cpu``: its sizes at
    the dim-64 ViT of the strategies' ``cpu`` preset, where its defaults do not fit (the ~5% budget of
    suites/petl.yaml; the paper's r = 512 is above the width d = 64 and is refused there)."""
    def wrap(factory):
        factory.reads, factory.cpu = reads, cpu or {}
        return METHODS.register(name)(factory)
    return wrap


def unused_fields(name: str, args: MethodArgs) -> list[str]:
    """Fields of ``args`` that are set (not ``None``) but that method ``name`` does not read."""
    reads = METHODS.get(name).reads
    return [f.name for f in fields(MethodArgs) if f.name not in reads and getattr(args, f.name) is not None]


def _places(a: MethodArgs, default: str) -> tuple[str, ...]:
    return PLACEMENTS[a.get("placement", default)]


def _prefix(a: MethodArgs, length: int) -> Modification:
    return Modification("prefix", "heads", "parallel", "gated", length, reparam=a.get("prefix_reparam"))


@method("prefix", reads=("size", "prefix_reparam"))
def prefix(a: MethodArgs) -> PETLConfig:
    """Prefix tuning: ``l`` key/value vectors per layer, gated composition (Li & Liang, 2021)."""
    return PETLConfig((_prefix(a, a.get("size", 30)),))


@method("adapter_seq", reads=("size", "placement"), cpu={"size": 20})
def adapter_seq(a: MethodArgs) -> PETLConfig:
    """Sequential (Houlsby) adapters ``h ← h + f(h W_down) W_up`` after attention and FFN (Houlsby et al., 2019)."""
    return PETLConfig(tuple(Modification("adapter", p, "sequential", "add", a.get("size", 512))
                            for p in _places(a, "both")))


@method("adapter_par", reads=("size", "placement"), cpu={"size": 20})
def adapter_par(a: MethodArgs) -> PETLConfig:
    """Parallel adapter ``h ← h + f(x W_down) W_up`` at the FFN (He et al., 2022)."""
    return PETLConfig(tuple(Modification("adapter", p, "parallel", "add", a.get("size", 512))
                            for p in _places(a, "ffn")))


@method("scaled_par_adapter", reads=("size", "placement", "scale"), cpu={"size": 20})
def scaled_par_adapter(a: MethodArgs) -> PETLConfig:
    """Scaled parallel adapter ``h ← h + s · f(x W_down) W_up`` at the FFN (He et al., 2022)."""
    return PETLConfig(tuple(Modification("adapter", p, "parallel", "scaled", a.get("size", 512), scale=a.get("scale"))
                            for p in _places(a, "ffn")))


@method("mh_par_adapter", reads=("size",), cpu={"size": 8})
def mh_par_adapter(a: MethodArgs) -> PETLConfig:
    """Multi-head parallel adapter: one adapter per head on the attention output before ``W_o`` (He et al.)."""
    return PETLConfig((Modification("adapter", "heads", "parallel", "add", a.get("size", 512)),))


@method("lora", reads=("size", "placement", "lora_alpha"))
def lora(a: MethodArgs) -> PETLConfig:
    """LoRA ``W x + (α/r) B A x`` on ``W_q`` and ``W_v`` (``placement: attn``, the default), the FFN's ``W_1`` and
    ``W_2`` (``ffn``) or both (Hu et al., 2022)."""
    r = a.get("size", 8)
    return PETLConfig(tuple(Modification("lora", p, "parallel", "scaled", r, scale=a.get("lora_alpha") / r)
                            for p in _places(a, "attn")))


@method("mam", reads=("size", "scale", "prefix_length", "prefix_reparam"), cpu={"size": 19, "prefix_length": 1})
def mam(a: MethodArgs) -> PETLConfig:
    """MAM adapter: a small prefix (``prefix_length``) on attention + a large scaled parallel adapter (``size``,
    ``s``) on the FFN."""
    return PETLConfig((_prefix(a, a.get("prefix_length")),
                       Modification("adapter", "ffn", "parallel", "scaled", a.get("size", 512), scale=a.get("scale"))))


# ---- the family's controls (He et al. compare every method with full fine-tuning): no PETL module, the same
# strategies, template, optimizer, classifier and checkpoint as the methods above
@method("head_only", reads=())
def head_only(a: MethodArgs) -> PETLConfig:
    """Head only (linear probe): the pre-trained backbone frozen, no PETL module, only the classifier trained."""
    return PETLConfig()


@method("full_finetune", reads=())
def full_finetune(a: MethodArgs) -> PETLConfig:
    """Full fine-tuning: every backbone weight trained with the classifier (He et al.'s upper reference)."""
    return PETLConfig(train_backbone=True)


def build_method(name: str, args: MethodArgs | None = None) -> PETLConfig:
    """``METHODS.get(name)(args)``."""
    return METHODS.get(name)(args or MethodArgs())
