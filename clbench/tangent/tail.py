"""The non-linear counterpart of a tangent model: the trainable tail of a ViT (last ``k`` blocks, final norm, head).

Non-linear fine-tuning (NLFT), model soups and SISA train the same parameters that TAFT perturbs, from the same
linearization point ``w0``, on the same cached prefix tokens ``h = prefix(x): (B, N, D)``::

    logits = head(pool(norm(blocks[-k:](h))))          (B, K)
"""

from __future__ import annotations

import copy

from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from clbench.models.vit import ReAttentionViT


class TailModel(nn.Module):
    """``forward(h: (B, N, D)) -> logits (B, K)``; parameters keep the ViT's names (``blocks.5.attn.qkv.weight``)."""

    def __init__(self, vit: VisionTransformer, last_blocks: int) -> None:
        super().__init__()
        if isinstance(vit, ReAttentionViT):
            raise ValueError("TailModel runs the ViT's blocks with vanilla attention and cannot run Re-Attention: "
                             "set model_args attention: vanilla.")
        depth = len(vit.blocks)
        self.blocks = nn.ModuleDict({str(i): copy.deepcopy(vit.blocks[i]) for i in range(depth - last_blocks, depth)})
        for block in self.blocks.values():
            block.attn.fused_attn = False
        self.norm = copy.deepcopy(vit.norm)
        self.fc_norm = copy.deepcopy(vit.fc_norm)
        self.head = copy.deepcopy(vit.head)
        self.global_pool = vit.global_pool
        self.num_prefix_tokens = vit.num_prefix_tokens

    def forward(self, h: Tensor) -> Tensor:
        for block in self.blocks.values():
            h = block(h)
        h = self.norm(h)
        h = h[:, 0] if self.global_pool == "token" else h[:, self.num_prefix_tokens:].mean(dim=1)
        return self.head(self.fc_norm(h))
