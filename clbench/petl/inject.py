"""Injection of PETL modules into a timm ``VisionTransformer`` without editing timm.

:func:`inject` freezes the ViT and replaces, in every block, the submodules a method touches by hooks that hold the
original module (``base``) and look up the PETL modules of the *active* :class:`~clbench.petl.modules.PETLSet`
(:class:`Slot`; the hooks own no parameters, so several sets can share one frozen backbone)::

    block.attn      -> AttentionHook: prefix keys/values, per-head adapter before W_o, adapter on the output
    block.mlp       -> MlpHook: adapter on the FFN output
    attn.qkv, mlp.fc1, mlp.fc2 -> LinearHook: LoRA's Δy (skipped while merged into W)

Per block (pre-norm timm block, ``x`` = the normalized sublayer input, ``h`` = the sublayer output):

    attention:  h = W_o [head_1(x); ...; head_N(x)] (+ Δz_i per head),   head_i = Attn(x W_q^i, [P_k^i; x W_k^i],
                [P_v^i; x W_v^i]),  then h ← h + Δh (Δh from x: parallel; from h: sequential)
    FFN:        h = FFN(x), h ← h + Δh

With no active set (or zero-initialized modules) every hook returns exactly what the base module returns. A full
fine-tuning set (``PETLConfig.train_backbone``, no modifications, so no hooks) holds its own trainable copy of the ViT
(:meth:`PETLViT.new_set`), which runs in place of the frozen one while the set is active: the frozen ViT stays the
pre-trained ``φ_0`` for every method. The
prefix path recomputes timm's attention with the base's own layers (fused SDPA or the explicit softmax, as the base
is set); it supports unmasked self-attention only, which is what a ViT uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from clbench.petl.config import PETLConfig, ViTShape
from clbench.petl.modules import PETLSet


class Slot:
    """The module set the hooks use (``active``; None = the base model). Not an ``nn.Module``: sets are owned by
    whoever trains them."""

    def __init__(self) -> None:
        self.active: PETLSet | None = None
        self.merged = False
        self._prefixes: tuple[tuple[int, int], Tensor] | None = None

    def module(self, layer: int, key: str) -> nn.Module | None:
        """The active set's module ``key`` of block ``layer`` (None: no set, or none there)."""
        if self.active is None or key not in self.active.blocks[layer]:
            return None
        return self.active.blocks[layer][key]

    def prefix(self, layer: int, batch: int) -> Tensor | None:
        """``(B, 2, l, d)`` keys and values of block ``layer`` for a batch of ``B`` (the bank is evaluated once per
        forward pass)."""
        if self.active is None or self.active.prefix is None:
            return None
        key = (id(self.active), batch)
        if layer == 0 or self._prefixes is None or self._prefixes[0] != key:
            self._prefixes = (key, self.active.prefix(batch))
        return self._prefixes[1][:, layer]


class LinearHook(nn.Module):
    """``y = base(x) + Δy`` with ``Δy`` the active set's LoRA under ``key`` in block ``layer`` (none: ``base(x)``)."""

    def __init__(self, base: nn.Linear, layer: int, key: str, slot: Slot) -> None:
        super().__init__()
        self.base, self.layer, self.key, self.slot = base, layer, key, slot
        self._saved: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        lora = self.slot.module(self.layer, self.key)
        return out if lora is None or self.slot.merged else lora(out, x)

    @torch.no_grad()
    def merge(self) -> None:
        lora = self.slot.module(self.layer, self.key)
        if lora is not None:
            self._saved = self.base.weight.detach().clone()
            self.base.weight.add_(lora.delta_weight().to(self.base.weight.dtype))

    @torch.no_grad()
    def unmerge(self) -> None:
        if self._saved is not None:
            self.base.weight.copy_(self._saved)              # exactly the weight before merge()
            self._saved = None


class MlpHook(nn.Module):
    """``h = FFN(x)``, then ``h + Δh`` with the active set's adapter under ``ffn``."""

    def __init__(self, base: nn.Module, layer: int, slot: Slot) -> None:
        super().__init__()
        self.base, self.layer, self.slot = base, layer, slot

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)
        adapter = self.slot.module(self.layer, "ffn")
        return out if adapter is None else out + adapter(out if adapter.sequential else x)


class AttentionHook(nn.Module):
    """timm ``Attention`` with the active set's prefix (``P_k, P_v`` prepended to every head's keys and values),
    per-head adapter (``heads``) and sublayer adapter (``attn``); see the module docstring."""

    def __init__(self, base: nn.Module, layer: int, slot: Slot) -> None:
        super().__init__()
        self.base, self.layer, self.slot = base, layer, slot

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        prefix, heads = self.slot.prefix(self.layer, x.shape[0]), self.slot.module(self.layer, "heads")
        if prefix is None and heads is None:
            out = self.base(x, attn_mask=attn_mask, is_causal=is_causal)
        else:
            if attn_mask is not None or is_causal:
                raise ValueError("PETL prefixes and per-head adapters support unmasked self-attention only.")
            out = self._attention(x, prefix, heads)
        adapter = self.slot.module(self.layer, "attn")
        return out if adapter is None else out + adapter(out if adapter.sequential else x)

    def _attention(self, x: Tensor, prefix: Tensor | None, heads: nn.Module | None) -> Tensor:
        """timm's ``Attention.forward`` (same layers, same order) with keys ``[P_k; K]``, values ``[P_v; V]``
        ``(B, N_h, l + N, d_h)`` and ``Δz`` added to the heads' outputs ``(B, N, N_h, d_h)``."""
        a = self.base
        batch, tokens, _ = x.shape
        gate = a.gate(x).sigmoid() if getattr(a, "gate", None) is not None else None
        qkv = a.qkv(x).reshape(batch, tokens, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = a.q_norm(q), a.k_norm(k)
        if prefix is not None:                                               # (B, 2, l, d)
            pk, pv = (prefix[:, j].reshape(batch, -1, a.num_heads, a.head_dim).transpose(1, 2).to(k.dtype)
                      for j in (0, 1))
            k, v = torch.cat((pk, k), dim=2), torch.cat((pv, v), dim=2)
        if a.fused_attn:
            z = F.scaled_dot_product_attention(q, k, v, dropout_p=a.attn_drop.p if a.training else 0.0)
        else:
            attn = ((q * a.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            z = a.attn_drop(attn) @ v
        z = z.transpose(1, 2)                                                # (B, N, N_h, d_h)
        if heads is not None:
            z = z + heads(x)
        z = a.norm(z.reshape(batch, tokens, a.attn_dim))
        if gate is not None:
            z = z * gate
        return a.proj_drop(a.proj(z))


class PETLViT(nn.Module):
    """A frozen timm ViT with PETL hooks (:func:`inject`); ``forward`` uses the set made active by :meth:`use`
    (none: the base model; a full fine-tuning set: its own copy of the ViT); ``shape`` is the ViT's
    :class:`ViTShape`. ``forward: (B, C, H, W) -> (B, d)`` when the ViT's head was reset, else logits."""

    def __init__(self, vit: nn.Module, slot: Slot, shape: ViTShape) -> None:
        super().__init__()
        self.vit, self.slot, self.shape = vit, slot, shape

    def forward(self, x: Tensor) -> Tensor:
        active = self.slot.active
        return (self.vit if active is None or active.backbone is None else active.backbone)(x)

    def new_set(self, config: PETLConfig) -> PETLSet:
        """A fresh module set of ``config`` for this ViT; for full fine-tuning (``config.train_backbone``) it holds a
        trainable copy of the frozen ViT (its pre-trained weights)."""
        copy = deepcopy(self.vit).requires_grad_(True) if config.train_backbone else None
        return PETLSet(config, self.shape, backbone=copy)

    def activate(self, petl: PETLSet | None) -> None:
        if self.slot.merged:
            raise RuntimeError("unmerge() LoRA before switching module sets.")
        self.slot.active = petl
        self.slot._prefixes = None

    @contextmanager
    def use(self, petl: PETLSet | None) -> Iterator[PETLViT]:
        """Run with ``petl`` active, then restore the previous set."""
        previous = self.slot.active
        self.activate(petl)
        try:
            yield self
        finally:
            self.activate(previous)

    def _linear_hooks(self) -> list[LinearHook]:
        return [m for m in self.vit.modules() if isinstance(m, LinearHook)]

    def merge(self) -> None:
        """Fold the active set's LoRA into the frozen weights (``W ← W + s B A``); hooks then skip ``Δy``."""
        if not self.slot.merged:
            for hook in self._linear_hooks():
                hook.merge()
            self.slot.merged = True

    def unmerge(self) -> None:
        """Restore the weights saved by :meth:`merge` bit for bit."""
        for hook in self._linear_hooks():
            hook.unmerge()
        self.slot.merged = False


def inject(vit: nn.Module, config: PETLConfig) -> PETLViT:
    """Freeze ``vit`` (``requires_grad = False``) and put hooks where ``config``'s modifications act, in every
    block; returns the wrapped model (no set active). The ViT is modified in place."""
    shape = ViTShape.of(vit)
    vit.requires_grad_(False)
    slot = Slot()
    keys = {m.key for m in config.modifications}
    attention = bool(keys & {"attn", "heads", "prefix:heads"})
    for layer, block in enumerate(vit.blocks):
        if "lora:attn" in keys:
            block.attn.qkv = LinearHook(block.attn.qkv, layer, "qkv", slot)
        if "lora:ffn" in keys:
            block.mlp.fc1 = LinearHook(block.mlp.fc1, layer, "fc1", slot)
            block.mlp.fc2 = LinearHook(block.mlp.fc2, layer, "fc2", slot)
        if attention:
            block.attn = AttentionHook(block.attn, layer, slot)
        if "ffn" in keys:
            block.mlp = MlpHook(block.mlp, layer, slot)
    return PETLViT(vit, slot, shape)
