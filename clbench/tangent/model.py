"""``linearize(vit, last_blocks=k)``: a timm VisionTransformer turned into its tangent model.

    f_lin(x) = f(x; w0) + J_w f(x; w0) · Δ

where ``w0`` are the ViT's weights (the linearization point) and ``Δ`` perturbs the last ``k`` blocks, the final
norm, the classification head and (``linearize_cls=True``) the CLS token. Everything is computed in one forward pass
of tangent layers (:mod:`clbench.tangent.layers`). The blocks before the last ``k`` run unmodified (``ẋ = 0``), so
their output tokens ``h = prefix(x): (B, N, D)`` depend on the input only and can be cached per training sample
(:meth:`TangentModel.prefix` then :meth:`TangentModel.from_prefix`); with a tangent CLS token the tangent enters
before block 0 and the prefix must be re-run (``prefix_cacheable`` is False).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from timm.models.vision_transformer import VisionTransformer, init_weights_vit_timm
from torch import Tensor, nn

from clbench.models.vit import ReAttentionViT
from clbench.tangent.layers import TangentBlock, TangentIdentity, TangentLayerNorm, TangentLinear


def _tangent_norm(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.LayerNorm):
        return TangentLayerNorm(module)
    if isinstance(module, nn.Identity):
        return TangentIdentity()
    raise ValueError(f"unsupported norm {module!r}: TangentModel handles LayerNorm or Identity.")


def _check_supported(vit: VisionTransformer) -> None:
    problems = []
    if vit.global_pool not in ("token", "avg"):
        problems.append(f"global_pool={vit.global_pool!r} (token or avg supported)")
    if vit.attn_pool is not None or vit.reg_token is not None or vit.dynamic_img_size:
        problems.append("attention pooling / register tokens / dynamic image size")
    if not isinstance(vit.head, nn.Linear):
        problems.append("a non-linear head")
    if isinstance(vit, ReAttentionViT):
        problems.append("Re-Attention (the tangent layers linearize vanilla attention; set model_args attention: "
                        "vanilla)")
    if problems:
        raise ValueError(f"linearize() cannot handle this VisionTransformer: {'; '.join(problems)}.")


class TangentModel(nn.Module):
    """The tangent model of a timm ViT. ``forward(x: (B, C, H, W)) -> f_lin logits (B, K)``.

    Its only parameters are the ``Δ`` (zero at construction), named after the parameters they perturb
    (``blocks.5.attn.qkv.weight``, ``norm.weight``, ``head.bias``, ``cls_token``); the linearization point ``w0``
    is held in buffers, so ``state_dict()`` carries both and ``delta_state()`` the ``Δ`` only.
    """

    def __init__(self, vit: VisionTransformer, last_blocks: int, linearize_cls: bool) -> None:
        super().__init__()
        _check_supported(vit)
        depth = len(vit.blocks)
        if not 0 <= last_blocks <= depth:
            raise ValueError(f"last_blocks={last_blocks} is outside 0..{depth} for this ViT.")
        self.last_blocks = last_blocks
        self.linearize_cls = linearize_cls
        self.first_tangent = depth - last_blocks
        self.global_pool = vit.global_pool
        self.num_prefix_tokens = vit.num_prefix_tokens
        # Frozen stem (patch embedding, CLS/position embedding, pre-norm) as buffers: no parameters leak into Δ.
        stem = copy.deepcopy(nn.ModuleDict({"patch_embed": vit.patch_embed, "norm_pre": vit.norm_pre}))
        for module in stem.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                delattr(module, name)
                module.register_buffer(name, param.detach().clone())
        self.stem = stem
        self.register_buffer("cls_token0", None if vit.cls_token is None else vit.cls_token.detach().clone())
        self.register_buffer("pos_embed0", None if vit.pos_embed is None else vit.pos_embed.detach().clone())
        self.no_embed_class = vit.no_embed_class
        if linearize_cls and vit.cls_token is None:
            raise ValueError("linearize_cls=True needs a ViT with a CLS token.")
        self.cls_token = nn.Parameter(torch.zeros_like(vit.cls_token)) if linearize_cls else None
        # Blocks before the last k: tangent-capable (for a tangent CLS token) but without Δ.
        self.frozen_blocks = nn.ModuleList(TangentBlock(b, delta=False) for b in vit.blocks[: self.first_tangent])
        self.blocks = nn.ModuleDict({str(i): TangentBlock(vit.blocks[i]) for i in range(self.first_tangent, depth)})
        self.norm = _tangent_norm(vit.norm)
        self.fc_norm = _tangent_norm(vit.fc_norm)
        self.head = TangentLinear(vit.head)
        self.to(vit.cls_token.device if vit.cls_token is not None else vit.head.weight.device)

    # ------------------------------------------------------------------------------------------------ parameters
    def named_tangent_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """``(name, Δ)`` pairs; ``name`` is the original ViT parameter that ``Δ`` perturbs."""
        return self.named_parameters()

    def tangent_parameters(self) -> Iterator[nn.Parameter]:
        return (p for _, p in self.named_tangent_parameters())

    @torch.no_grad()
    def randomize_deltas(self, scale: float, seed: int = 0) -> TangentModel:
        """Fill every ``Δ`` with ``scale · N(0, 1)`` drawn from ``seed`` (for checks and benchmarks; training
        starts from ``Δ = 0``). Returns ``self``."""
        generator = torch.Generator().manual_seed(seed)
        for p in self.tangent_parameters():
            p.copy_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        return self

    def delta_state(self) -> dict[str, Tensor]:
        """A detached copy of every ``Δ`` keyed by its original parameter name."""
        return {name: p.detach().clone() for name, p in self.named_tangent_parameters()}

    @torch.no_grad()
    def load_delta(self, delta: dict[str, Tensor]) -> None:
        """Set every ``Δ`` from ``delta`` (the keys of :meth:`delta_state`)."""
        own = dict(self.named_tangent_parameters())
        if set(own) != set(delta):
            raise KeyError(f"delta keys differ from this model's: {sorted(set(own) ^ set(delta))[:5]}")
        for name, p in own.items():
            p.copy_(delta[name])

    def linearization_point(self) -> dict[str, Tensor]:
        """The frozen ``w0`` (and stem) buffers; two tangent models compose only if these are equal."""
        return {n: b for n, b in self.named_buffers() if b is not None}

    # --------------------------------------------------------------------------------------------------- forward
    @property
    def prefix_cacheable(self) -> bool:
        """True when the frozen prefix sees no tangent, so ``prefix(x)`` can be cached per sample."""
        return not self.linearize_cls

    def embed(self, x: Tensor) -> Tensor:
        """Patch embedding + CLS + position embedding (frozen): ``(B, C, H, W) -> (B, N, D)``."""
        tokens = self.stem["patch_embed"](x)
        tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        parts = [] if self.cls_token0 is None else [self.cls_token0.expand(tokens.shape[0], -1, -1)]
        if self.pos_embed0 is not None and self.no_embed_class:
            tokens = tokens + self.pos_embed0
        tokens = torch.cat(parts + [tokens], dim=1)
        if self.pos_embed0 is not None and not self.no_embed_class:
            tokens = tokens + self.pos_embed0
        return self.stem["norm_pre"](tokens)

    def _cls_tangent(self, tokens: Tensor) -> Tensor | None:
        """``ẋ`` of the token sequence at the stem output: ``Δcls`` at position 0, zero elsewhere."""
        if self.cls_token is None:
            return None
        zeros = torch.zeros_like(tokens[:, 1:])
        return torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), zeros], dim=1)

    def prefix(self, x: Tensor) -> Tensor:
        """Tokens after the frozen blocks, ``(B, N, D)``; only valid as a cache when ``prefix_cacheable``."""
        h = self.embed(x)
        for block in self.frozen_blocks:
            h, _ = block(h, None)
        return h

    def from_prefix(self, h: Tensor, hd: Tensor | None = None) -> Tensor:
        """f_lin logits ``(B, K)`` from the prefix tokens ``h`` (and their tangent ``hd``)."""
        for block in self.blocks.values():
            h, hd = block(h, hd)
        h, hd = self.norm(h, hd)
        h, hd = self._pool(h), None if hd is None else self._pool(hd)
        h, hd = self.fc_norm(h, hd)
        y, yd = self.head(h, hd)
        return y if yd is None else y + yd

    def _pool(self, h: Tensor) -> Tensor:
        if self.global_pool == "token":
            return h[:, 0]
        return h[:, self.num_prefix_tokens:].mean(dim=1)

    def forward(self, x: Tensor) -> Tensor:
        if self.prefix_cacheable:
            return self.from_prefix(self.prefix(x))
        h = self.embed(x)
        hd = self._cls_tangent(h)
        for block in self.frozen_blocks:
            h, hd = block(h, hd)
        return self.from_prefix(h, hd)


def reset_blocks(vit: VisionTransformer, last_blocks: int) -> None:
    """Re-initialize the last ``last_blocks`` blocks with timm's ViT init (truncated normal, std 0.02), in place."""
    for block in vit.blocks[len(vit.blocks) - last_blocks:]:
        block.apply(init_weights_vit_timm)


def linearize(vit: VisionTransformer, last_blocks: int = 1, reset: bool = False,
              linearize_cls: bool = False) -> TangentModel:
    """Return the tangent model of ``vit`` around its weights; ``vit`` itself is left unchanged.

    ``reset=True`` linearizes around a copy whose last ``last_blocks`` blocks are re-initialized (drawn from the
    global torch RNG) — the paper's choice when the target task is far from the pre-training data.
    """
    if reset:
        vit = copy.deepcopy(vit)
        reset_blocks(vit, last_blocks)
    return TangentModel(vit, last_blocks, linearize_cls)
