"""timm Vision Transformers of any size, shaped by the scenario (image size, channels, classes), with vanilla attention
or Re-Attention (:class:`ReAttentionViT`; Ding et al., ICML 2024; equations in :mod:`clbench.privacy.reattention`)."""

from __future__ import annotations

import torch
from timm.layers import DropPath, LayerScale, Mlp
from timm.layers import LayerNorm as TimmLayerNorm
from timm.layers.attention import Attention
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from clbench.models.checkpoint import load_weights
from clbench.privacy.reattention import (
    ErrorPrior,
    activation_var,
    conv2d_var,
    layer_norm_var,
    layer_scale_var,
    linear_var,
    score_correction,
)
from clbench.privacy.rules import LAYER_NORM, LAYER_SCALE, VIT_TOKENS, register_rule
from clbench.protocol import ClassificationInfo
from clbench.registry import MODELS
from clbench.typecheck import Divides, check_divides


class ReAttentionViT(VisionTransformer):
    """A timm ``VisionTransformer`` (same parameters, same ``state_dict``) whose blocks use Re-Attention once an
    :class:`~clbench.privacy.reattention.ErrorPrior` with ``σ_dp > 0`` is set (:meth:`set_error_prior`; the ``dp``
    callback sets it from each training call's noise). Until then, :meth:`forward_features` is timm's own.

    With one, the forward pass also carries ``var: (B, N, D)``, the variance of every token coordinate, from the
    trainable parameters' errors ``s = σ_eff² = (σ_dp R / B̄)²`` (0 for a frozen parameter, which is not noised):

        patch tokens    Var = s_W Σ_{patch} x² + s_b                 (Conv2d = Linear on patches; images are exact)
        tokens h_0      [cls; patches] + pos_embed:  Var = [s_cls; Var patches] + s_pos
        block           a = LN_1 h;  q, k, v = qkv(a);  A = softmax(⟨q̃_i, k_j⟩ − C_i σ_j²/2)   (Re-Attention)
                        h ← h + ls_1(proj(A v));  h ← h + ls_2(fc_2 GELU(fc_1 LN_2 h))

    with ``σ_j²`` the mean over a head's dimensions of ``Var k_j`` (:func:`linear_var` of ``qkv``), the attention
    output's ``Var o_i = Σ_j A_ij² Var v_j``, residual sums adding variances, and the Linear / LayerNorm / GELU /
    LayerScale rules of :mod:`clbench.privacy.reattention`. Dropout and stochastic depth are applied to the means;
    the variances ignore them. The last block's output variance is not needed and not computed.

    Supported layout: timm's default (class token, ``pos_embed`` added after the class token is concatenated, no
    register tokens), blocks of type ``Block`` with plain ``Attention`` (no qk-norm, scale-norm or gate) and ``Mlp``
    with exact GELU; anything else (e.g. PETL hooks in the blocks) is refused when tracking starts.
    """

    error_prior: ErrorPrior | None = ErrorPrior(0.0, 1.0)          # σ_dp = 0 until the dp callback sets its noise

    def set_error_prior(self, prior: ErrorPrior | None) -> None:
        """Track variances and correct the attention scores from ``prior`` (``σ_dp = 0``: vanilla; None: vanilla
        and not updated by the ``dp`` callback)."""
        self.error_prior = prior

    def forward_features(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        prior = self.error_prior
        if prior is None or not prior.active:
            return super().forward_features(x, attn_mask, is_causal)
        if attn_mask is not None or is_causal:
            raise ValueError("ReAttentionViT tracks errors for unmasked self-attention only.")
        self._check_trackable()
        h, var = self._tokens(x)
        for i, block in enumerate(self.blocks):
            h, var = self._block(block, h, var, track=i < len(self.blocks) - 1)
        return self.norm(h)

    # -------------------------------------------------------------------------------------------- variances
    def _var(self, p: Tensor | None) -> float:
        """``σ_eff²`` of parameter ``p``: the prior's dense error if it is trained, else 0 (not noised)."""
        return self.error_prior.dense_var if p is not None and p.requires_grad else 0.0

    def _vars(self, module: nn.Module) -> tuple[float, float]:
        return self._var(module.weight), self._var(module.bias)

    def _tokens(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``h_0 = [cls; patches] + pos_embed`` (timm's own ``_pos_embed``) and its variance ``(B, N, D)``."""
        h = self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(x))))
        with torch.no_grad():
            proj = self.patch_embed.proj
            patches = conv2d_var(x, torch.zeros_like(x), proj, *self._vars(proj)).flatten(2).transpose(1, 2)
            cls = torch.full_like(h[:, :1], self._var(self.cls_token))
            var = torch.cat([cls, patches], 1) + self._var(self.pos_embed)
        return h, var

    def _block(self, block: Block, h: Tensor, var: Tensor, track: bool) -> tuple[Tensor, Tensor | None]:
        """One pre-norm block on tokens ``h`` with variances ``var``; ``track=False``: no output variance."""
        a = block.norm1(h)
        with torch.no_grad():
            a_var = layer_norm_var(h, var, block.norm1, *self._vars(block.norm1))
        o, o_var = self._attention(block.attn, a, a_var, track)
        s = block.ls1(o)
        h = h + block.drop_path1(s)
        f = block.norm2(h)
        z = block.mlp.fc1(f)
        g = block.mlp.act(z)
        y = block.mlp.drop2(block.mlp.fc2(block.mlp.norm(block.mlp.drop1(g))))
        out = h + block.drop_path2(block.ls2(y))
        if not track:
            return out, None
        with torch.no_grad():
            var = var + self._layer_scale_var(block.ls1, o, o_var)
            f_var = layer_norm_var(h, var, block.norm2, *self._vars(block.norm2))
            g_var = activation_var("gelu", z, linear_var(f, f_var, block.mlp.fc1, *self._vars(block.mlp.fc1)))
            y_var = linear_var(g, g_var, block.mlp.fc2, *self._vars(block.mlp.fc2))
            return out, var + self._layer_scale_var(block.ls2, y, y_var)

    def _attention(self, attn: Attention, a: Tensor, a_var: Tensor, track: bool) -> tuple[Tensor, Tensor | None]:
        """Re-Attention on ``a: (B, N, D)`` with variances ``a_var``; returns the output and (``track``) its
        variance."""
        b, n, _ = a.shape

        def heads(t: Tensor) -> tuple[Tensor, Tensor, Tensor]:                 # (B, N, 3·H·d_h) -> 3 × (B, H, N, d_h)
            return t.reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

        q, k, v = heads(attn.qkv(a))
        with torch.no_grad():
            _, k_var, v_var = heads(linear_var(a, a_var, attn.qkv, *self._vars(attn.qkv)))
        q = q * attn.scale                                                     # q̃ = q / √d_h
        weights = (q @ k.transpose(-2, -1) - score_correction(q, k_var)).softmax(-1)
        o = (attn.attn_drop(weights) @ v).transpose(1, 2).reshape(b, n, attn.attn_dim)
        out = attn.proj_drop(attn.proj(o))
        if not track:
            return out, None
        with torch.no_grad():
            o_var = (weights.square() @ v_var).transpose(1, 2).reshape(b, n, attn.attn_dim)
            return out, linear_var(o, o_var, attn.proj, *self._vars(attn.proj))

    def _layer_scale_var(self, ls: nn.Module, x: Tensor, x_var: Tensor) -> Tensor:
        return layer_scale_var(x, x_var, ls.gamma, self._var(ls.gamma)) if isinstance(ls, LayerScale) else x_var

    def _check_trackable(self) -> None:
        """Refuse a layout the variance path does not follow (it would silently skip a layer)."""
        problems = []
        if self.cls_token is None or self.pos_embed is None or self.reg_token is not None or self.no_embed_class \
                or self.dynamic_img_size:
            problems.append("a layout other than [cls; patches] + pos_embed")
        if not all(isinstance(m, nn.Identity) for m in (self.patch_embed.norm, self.norm_pre, self.patch_drop)):
            problems.append("a patch-embedding norm, pre-norm or patch dropout")
        for i, block in enumerate(self.blocks):
            attn, mlp = block.attn, block.mlp
            ok = (type(block) is Block and type(attn) is Attention and type(mlp) is Mlp
                  and all(isinstance(m, nn.Identity) for m in (attn.q_norm, attn.k_norm, attn.norm, mlp.norm))
                  and attn.gate is None and isinstance(mlp.act, nn.GELU) and mlp.act.approximate == "none"
                  and all(isinstance(m, (nn.Identity, LayerScale)) for m in (block.ls1, block.ls2))
                  and all(isinstance(m, (nn.Identity, DropPath)) for m in (block.drop_path1, block.drop_path2)))
            if not ok:
                problems.append(f"block {i} is not a plain timm Block (Attention without qk-norm/gate, GELU Mlp)")
        if problems:
            raise ValueError(f"ReAttentionViT cannot track errors through {'; '.join(problems)}.")


register_rule(TimmLayerNorm)(LAYER_NORM)
register_rule(LayerScale)(LAYER_SCALE)
register_rule(VisionTransformer, ReAttentionViT)(VIT_TOKENS)
"""The per-sample norm rules of the timm layers (:mod:`clbench.privacy.rules`): registered here, where timm is
imported. ReAttentionViT's ``cls_token`` and ``pos_embed`` follow timm's rule (both forwards add them through timm's
``_pos_embed``, whose ``pos_drop`` sees the tokens)."""

VIT_CLASSES: dict[str, type[VisionTransformer]] = {"vanilla": VisionTransformer, "reattention": ReAttentionViT}
"""``attention`` option of :func:`vit` -> the model class."""


@MODELS.register("vit")
def vit(info: ClassificationInfo, *, embed_dim: int = 64, depth: int = 2, num_heads: int = 4, patch_size: int = 4,
        mlp_ratio: float = 4.0, qkv_bias: bool = True, init_values: float | None = None,
        drop_path_rate: float = 0.0, num_classes: int | None = None, fused_attn: bool = True,
        init: str | None = None, attention: str = "vanilla") -> VisionTransformer:
    """A timm ``VisionTransformer`` (CLS-token pooling) for ``info.input_shape = (C, H, W)``.

    ``num_classes`` defaults to ``info.n_classes``; ``init`` is a local checkpoint loaded with
    :func:`clbench.models.checkpoint.load_weights` (a head of another width is skipped and reported).
    ``fused_attn=False`` uses the explicit softmax path (needed by forward-mode AD on CPU).
    ``attention="reattention"``: a :class:`ReAttentionViT` (vanilla until an error prior with ``σ_dp > 0`` is set).
    """
    if attention not in VIT_CLASSES:
        raise ValueError(f"attention must be one of {sorted(VIT_CLASSES)}, got {attention!r}.")
    check_divides(vit.divides, {"embed_dim": embed_dim, "num_heads": num_heads, "patch_size": patch_size},
                  info.input_shape, info.name)
    channels, height, width = info.input_shape
    model = VIT_CLASSES[attention](img_size=(height, width), patch_size=patch_size, in_chans=channels,
                                   num_classes=info.n_classes if num_classes is None else num_classes,
                                   embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
                                   qkv_bias=qkv_bias, init_values=init_values, drop_path_rate=drop_path_rate)
    for block in model.blocks:
        block.attn.fused_attn = fused_attn
    if init:
        load_weights(model, init)
    return model


vit.divides = (Divides("num_heads", "embed_dim", "each head takes embed_dim / num_heads dimensions"),
               Divides("patch_size", "height", "the image is cut into patch_size x patch_size patches"),
               Divides("patch_size", "width", "the image is cut into patch_size x patch_size patches"))
"""What :func:`vit` refuses, declared (recorded in the registries' index: the suite loader checks ``model_args``
against each scenario's recorded input shape before the imports)."""
