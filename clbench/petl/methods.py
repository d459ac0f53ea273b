"""The PETL methods by name: :data:`METHODS` maps a name to a factory ``MethodArgs -> PETLConfig``.

Every strategy in :mod:`clbench.strategies.petl` (``<method>``, ``<method>_per_task``, ``<method>_merge``) is
generated from this registry, so adding a method here adds its three strategies.

Defaults (:class:`MethodArgs`): the MAM adapter's sizes from He et al. (prefix ``l = 30``, FFN scaled parallel
adapter ``r = 512``, ``s = 4``) for the prefix and adapter methods; LoRA ``r = 8``, ``α = 16`` (``s = α/r = 2``, a
common LoRA setting, not a value from the unified-view paper). These are mBART-large-scale sizes: CPU runs set
``size`` (and ``prefix_length`` for MAM) for their ViT (see ``clbench/suites/petl.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clbench.petl.config import Modification, PETLConfig
from clbench.registry import Registry

PLACEMENTS = {"attn": ("attn",), "ffn": ("ffn",), "both": ("attn", "ffn")}


@dataclass
class MethodArgs:
    """Sizes and placements shared by every method (each factory reads the fields it needs)."""

    size: int | None = None       # r (adapters, LoRA) or l (prefix); None: the method's default
    placement: str | None = None  # adapters: attn | ffn | both; None: the method's default (Houlsby: both)
    scale: float = 4.0            # s of the scaled parallel adapter (and of MAM's)
    lora_alpha: float = 16.0      # LoRA's s = α / r
    lora_ffn: bool = False        # LoRA also on the FFN's W_1 and W_2
    prefix_reparam: int = 0       # hidden width of the prefix MLP (0: free prefix vectors)
    prefix_length: int = 30       # l of MAM's prefix

    def __post_init__(self) -> None:
        if self.placement is not None and self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {sorted(PLACEMENTS)} (or null), got {self.placement!r}.")


METHODS: Registry[Callable[[MethodArgs], PETLConfig]] = Registry("PETL method")


def _places(a: MethodArgs, default: str) -> tuple[str, ...]:
    return PLACEMENTS[a.placement or default]


@METHODS.register("prefix")
def prefix(a: MethodArgs) -> PETLConfig:
    """Prefix tuning: ``l`` key/value vectors per layer, gated composition (Li & Liang, 2021)."""
    return PETLConfig((Modification("prefix", "heads", "parallel", "gated", a.size or 30, reparam=a.prefix_reparam),))


@METHODS.register("adapter_seq")
def adapter_seq(a: MethodArgs) -> PETLConfig:
    """Sequential (Houlsby) adapters ``h ← h + f(h W_down) W_up`` after attention and FFN (Houlsby et al., 2019)."""
    return PETLConfig(tuple(Modification("adapter", p, "sequential", "add", a.size or 512)
                            for p in _places(a, "both")))


@METHODS.register("adapter_par")
def adapter_par(a: MethodArgs) -> PETLConfig:
    """Parallel adapter ``h ← h + f(x W_down) W_up`` at the FFN (He et al., 2022)."""
    return PETLConfig(tuple(Modification("adapter", p, "parallel", "add", a.size or 512) for p in _places(a, "ffn")))


@METHODS.register("scaled_par_adapter")
def scaled_par_adapter(a: MethodArgs) -> PETLConfig:
    """Scaled parallel adapter ``h ← h + s · f(x W_down) W_up`` at the FFN (He et al., 2022)."""
    return PETLConfig(tuple(Modification("adapter", p, "parallel", "scaled", a.size or 512, scale=a.scale)
                            for p in _places(a, "ffn")))


@METHODS.register("mh_par_adapter")
def mh_par_adapter(a: MethodArgs) -> PETLConfig:
    """Multi-head parallel adapter: one adapter per head on the attention output before ``W_o`` (He et al.)."""
    return PETLConfig((Modification("adapter", "heads", "parallel", "add", a.size or 512),))


@METHODS.register("lora")
def lora(a: MethodArgs) -> PETLConfig:
    """LoRA ``W x + (α/r) B A x`` on ``W_q`` and ``W_v`` (and the FFN with ``lora_ffn``) (Hu et al., 2022)."""
    r = a.size or 8
    places = ("attn", "ffn") if a.lora_ffn else ("attn",)
    return PETLConfig(tuple(Modification("lora", p, "parallel", "scaled", r, scale=a.lora_alpha / r)
                            for p in places))


@METHODS.register("mam")
def mam(a: MethodArgs) -> PETLConfig:
    """MAM adapter: prefix (``prefix_length``) on attention + scaled parallel adapter (``size``, ``s``) on the FFN."""
    return PETLConfig((Modification("prefix", "heads", "parallel", "gated", a.prefix_length, reparam=a.prefix_reparam),
                       Modification("adapter", "ffn", "parallel", "scaled", a.size or 512, scale=a.scale)))


def build_method(name: str, args: MethodArgs | None = None) -> PETLConfig:
    """``METHODS.get(name)(args)``."""
    return METHODS.get(name)(args or MethodArgs())
