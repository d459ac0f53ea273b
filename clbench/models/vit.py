"""timm Vision Transformers of any size, shaped by the scenario (image size, channels, classes)."""

from __future__ import annotations

from timm.models.vision_transformer import VisionTransformer

from clbench.models.checkpoint import load_weights
from clbench.protocol import ClassificationInfo
from clbench.registry import MODELS


@MODELS.register("vit")
def vit(info: ClassificationInfo, *, embed_dim: int = 64, depth: int = 2, num_heads: int = 4, patch_size: int = 4,
        mlp_ratio: float = 4.0, qkv_bias: bool = True, init_values: float | None = None,
        drop_path_rate: float = 0.0, num_classes: int | None = None, fused_attn: bool = True,
        init: str | None = None) -> VisionTransformer:
    """A timm ``VisionTransformer`` (CLS-token pooling) for ``info.input_shape = (C, H, W)``.

    ``num_classes`` defaults to ``info.n_classes``; ``init`` is a local checkpoint loaded with
    :func:`clbench.models.checkpoint.load_weights` (a head of another width is skipped and reported).
    ``fused_attn=False`` uses the explicit softmax path (needed by forward-mode AD on CPU).
    """
    channels, height, width = info.input_shape
    if height % patch_size or width % patch_size:
        raise ValueError(f"patch_size {patch_size} does not divide the image size {height}x{width} of {info.name}.")
    model = VisionTransformer(img_size=(height, width), patch_size=patch_size, in_chans=channels,
                              num_classes=info.n_classes if num_classes is None else num_classes,
                              embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
                              qkv_bias=qkv_bias, init_values=init_values, drop_path_rate=drop_path_rate)
    for block in model.blocks:
        block.attn.fused_attn = fused_attn
    if init:
        load_weights(model, init)
    return model
