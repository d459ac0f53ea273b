"""Tangent (linearized) transformers: TAFT linearization, tangent model composition, exact unlearning.

    f_lin(x) = f(x; w0) + J_w f(x; w0) · Δ          (Liu & Soatto, Tangent Transformers, ICLR 2024)

- :func:`linearize` turns a timm ViT into a :class:`TangentModel` (closed-form tangent layers in :mod:`.layers`);
- :func:`compose` averages the ``Δ`` of tangent models sharing ``w0`` (output = average of outputs);
- :mod:`.losses`: rescaled square loss + ridge, or cross-entropy; :mod:`.cache`: per-sample prefix cache;
- :mod:`.shards`: shard partitions and the running composition that forgets a shard by subtraction;
- :mod:`.rules`: per-sample gradient norm rules of the tangent layers (private training), registered on import.
"""

from clbench.tangent import rules  # noqa: F401 - registers the tangent layers' per-sample norm rules (clbench.privacy)
from clbench.tangent.cache import cache_prefix
from clbench.tangent.compose import average_deltas, compose
from clbench.tangent.losses import LOSSES, rescaled_square_loss, ridge, tangent_objective
from clbench.tangent.model import TangentModel, linearize, reset_blocks
from clbench.tangent.shards import ShardComposition, delta_hash, split_shards

__all__ = ["LOSSES", "ShardComposition", "TangentModel", "average_deltas", "cache_prefix", "compose",
           "delta_hash", "linearize", "rescaled_square_loss", "reset_blocks", "ridge", "split_shards",
           "tangent_objective"]
