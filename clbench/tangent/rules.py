"""Per-sample gradient norm rules of the tangent layers (:mod:`clbench.tangent.layers`) and of
:class:`~clbench.tangent.model.TangentModel`'s tangent CLS token, for private TAFT (:mod:`clbench.privacy`);
registered when :mod:`clbench.tangent` is imported (its ``__init__`` imports this module).

Each tangent layer's ``Δ`` acts on the tangent ``ẏ`` as its primal layer's parameters act on ``y``, with the primal
input as ``A`` and ``G = ∂L/∂ẏ``:

- ``TangentLinear``: ``ẏ = ΔW x + Δb + W0 ẋ`` — ``ΔW, Δb`` are a linear layer on ``x``;
- ``TangentLayerNorm``: ``ẏ = Δγ ⊙ x̂ + Δβ + ...`` — a LayerNorm's scale and shift on ``x̂``;
- ``TangentLayerScale``: ``ẏ = Δγ ⊙ x + ...`` — a LayerScale on ``x``;
- ``TangentModel``'s ``Δcls``: the stem's tangent ``ẋ`` holds ``Δcls`` at position 0, so ``∇Δcls_i = G_{i,0}`` with
  ``G`` the gradient of ``ẋ`` entering the first block.
"""

from __future__ import annotations

from torch import nn

from clbench.privacy.rules import (
    LAYER_NORM,
    LAYER_SCALE,
    LINEAR,
    UnsupportedLayerError,
    additive_rule,
    register_rule,
)
from clbench.tangent.layers import TangentLayerNorm, TangentLayerScale, TangentLinear
from clbench.tangent.model import TangentModel

register_rule(TangentLinear)(LINEAR)
register_rule(TangentLayerNorm)(LAYER_NORM)
register_rule(TangentLayerScale)(LAYER_SCALE)


def _first_tangent_block(model: TangentModel) -> nn.Module:
    blocks = list(model.frozen_blocks) + list(model.blocks.values())
    if not blocks:
        raise UnsupportedLayerError("TangentModel without blocks: nothing receives the tangent CLS token.")
    return blocks[0]


register_rule(TangentModel)(additive_rule(lambda model: {"cls_token": slice(0, 1)}, _first_tangent_block,
                                          use_input=1))

__all__: list[str] = []
