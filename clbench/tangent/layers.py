"""Closed-form linearized (tangent) layers: each maps a primal/tangent pair ``(x, ẋ) -> (y, ẏ)``.

A tangent layer computes, in one modified forward pass, the layer output at the linearization point ``w0`` and its
first-order change (Liu & Soatto, *Tangent Transformers*, ICLR 2024):

    y = f(x; w0)        ẏ = ∂f/∂x (x; w0) · ẋ  +  ∂f/∂w (x; w0) · Δw

so that chaining them gives ``f_lin(x) = f(x; w0) + J_w f(x; w0) · Δ`` for the whole network. ``w0`` is stored as
frozen buffers (``weight0``, ``bias0``); the trainable ``Δ`` are parameters carrying the ORIGINAL parameter names
(``weight``, ``bias``, ``gamma``), initialized to 0. A layer built with ``delta=False`` has no ``Δ`` (it only
propagates ``ẋ``; used for frozen blocks in front of a tangent CLS token).

``ẋ = None`` stands for an exactly-zero tangent and is never materialized: a layer without ``Δ`` and with ``ẋ = None``
returns ``ẏ = None`` and costs one ordinary forward (through the fused kernels: ``F.layer_norm``, ``F.gelu``,
``F.scaled_dot_product_attention``). Dropout and DropPath act as identity (the tangent model is a
deterministic function of ``(x, Δ)``). Shapes: tokens ``(B, N, D)``; attention ``(B, H, N, N)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import LayerScale
from torch import Tensor, nn

Pair = tuple[Tensor, Tensor | None]


def add_tangents(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """``a + b`` where ``None`` is an exact zero tangent."""
    if a is None:
        return b
    return a if b is None else a + b


def _frozen_copy(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().clone()


def _delta_like(t: Tensor | None, delta: bool) -> nn.Parameter | None:
    return nn.Parameter(torch.zeros_like(t)) if (delta and t is not None) else None


class TangentLinear(nn.Module):
    """Linearized ``nn.Linear``: ``y = W0 x + b0``,  ``ẏ = ΔW x + Δb + W0 ẋ``.

    ``x, ẋ: (..., D_in)``, ``y, ẏ: (..., D_out)``; ``ΔW: (D_out, D_in)`` and ``Δb: (D_out,)`` are the parameters
    ``weight`` / ``bias``.
    """

    def __init__(self, linear: nn.Linear, delta: bool = True) -> None:
        super().__init__()
        self.register_buffer("weight0", _frozen_copy(linear.weight))
        self.register_buffer("bias0", _frozen_copy(linear.bias))
        self.weight = _delta_like(linear.weight, delta)
        self.bias = _delta_like(linear.bias, delta)

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        y = F.linear(x, self.weight0, self.bias0)
        yd = F.linear(x, self.weight, self.bias) if self.weight is not None else None
        if xd is not None:
            yd = add_tangents(yd, F.linear(xd, self.weight0))
        return y, yd


class TangentGELU(nn.Module):
    """Linearized exact (erf) GELU ``y = x Φ(x)``:  ``ẏ = ẋ ⊙ (Φ(x) + x φ(x))`` with ``Φ`` the standard normal CDF
    ``Φ(x) = (1 + erf(x/√2))/2`` and ``φ(x) = exp(-x²/2)/√(2π)`` its density. Shapes are preserved."""

    _INV_SQRT2 = 1.0 / math.sqrt(2.0)
    _INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        if not (isinstance(act, nn.GELU) and act.approximate == "none"):
            raise ValueError(f"TangentGELU linearizes the exact (erf) nn.GELU, got {act!r}.")

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        if xd is None:
            return F.gelu(x), None
        cdf = 0.5 * (1.0 + torch.erf(x * self._INV_SQRT2))
        pdf = torch.exp(-0.5 * x * x) * self._INV_SQRT2PI
        return x * cdf, xd * (cdf + x * pdf)


class TangentLayerNorm(nn.Module):
    """Linearized LayerNorm over the last dimension ``D``.

    ``μ = mean(x)``, ``σ = sqrt(var(x) + ε)``, ``x̂ = (x − μ)/σ``, ``y = γ0 ⊙ x̂ + β0``. The derivative goes through
    the mean and the variance:

        dx̂ = (ẋ − mean(ẋ) − x̂ ⊙ mean(x̂ ⊙ ẋ)) / σ            ẏ = γ0 ⊙ dx̂ + Δγ ⊙ x̂ + Δβ

    with ``mean`` over ``D``; ``Δγ, Δβ: (D,)`` are the parameters ``weight`` / ``bias``.
    """

    def __init__(self, norm: nn.LayerNorm, delta: bool = True) -> None:
        super().__init__()
        if len(norm.normalized_shape) != 1:
            raise ValueError("TangentLayerNorm normalizes over the last dimension only.")
        self.eps = norm.eps
        self.register_buffer("weight0", _frozen_copy(norm.weight))
        self.register_buffer("bias0", _frozen_copy(norm.bias))
        self.weight = _delta_like(norm.weight, delta)
        self.bias = _delta_like(norm.bias, delta)

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        if xd is None and self.weight is None and self.bias is None:
            return F.layer_norm(x, x.shape[-1:], self.weight0, self.bias0, self.eps), None
        mu = x.mean(-1, keepdim=True)
        centered = x - mu
        inv_sigma = torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + self.eps)
        xhat = centered * inv_sigma
        y = xhat if self.weight0 is None else xhat * self.weight0
        y = y if self.bias0 is None else y + self.bias0
        yd = None
        if xd is not None:
            dxhat = (xd - xd.mean(-1, keepdim=True) - xhat * (xhat * xd).mean(-1, keepdim=True)) * inv_sigma
            yd = dxhat if self.weight0 is None else dxhat * self.weight0
        if self.weight is not None:
            yd = add_tangents(yd, xhat * self.weight)
        if self.bias is not None:
            yd = add_tangents(yd, self.bias.expand_as(y))
        return y, yd


class TangentLayerScale(nn.Module):
    """Linearized LayerScale ``y = γ0 ⊙ x``:  ``ẏ = Δγ ⊙ x + γ0 ⊙ ẋ`` (``Δγ: (D,)`` is the parameter ``gamma``)."""

    def __init__(self, scale: LayerScale, delta: bool = True) -> None:
        super().__init__()
        self.register_buffer("gamma0", _frozen_copy(scale.gamma))
        self.gamma = _delta_like(scale.gamma, delta)

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        yd = x * self.gamma if self.gamma is not None else None
        if xd is not None:
            yd = add_tangents(yd, xd * self.gamma0)
        return x * self.gamma0, yd


class TangentIdentity(nn.Module):
    """Identity on both the primal and the tangent (``nn.Identity``, Dropout, DropPath at this point)."""

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        return x, xd


class TangentAttention(nn.Module):
    """Linearized multi-head softmax self-attention (timm ``Attention`` without qk-norm or gating).

    With ``[Q, K, V] = qkv(x)`` split into ``H`` heads of width ``d`` (``Q, K, V: (B, H, N, d)``)::

        S = Q Kᵀ/√d                      Ṡ = (Q̇ Kᵀ + Q K̇ᵀ)/√d                       (B, H, N, N)
        A = softmax(S)  (rows)           Ȧ = A ⊙ Ṡ − A ⊙ rowsum(A ⊙ Ṡ)               (B, H, N, N)
        O = A V                          Ȯ = Ȧ V + A V̇                               (B, H, N, d)
        y = proj(concat_h O)             ẏ from the tangent ``proj``                  (B, N, D)

    ``Ȧ`` is the softmax Jacobian applied row by row in O(N²) per head (never the N²×N² Jacobian).
    """

    def __init__(self, attn: nn.Module, delta: bool = True) -> None:
        super().__init__()
        unsupported = [n for n in ("q_norm", "k_norm", "norm") if not isinstance(getattr(attn, n), nn.Identity)]
        if unsupported or getattr(attn, "gate", None) is not None:
            raise ValueError(f"TangentAttention supports plain timm Attention; this one has {unsupported or 'gate'}.")
        self.num_heads = attn.num_heads
        self.head_dim = attn.head_dim
        self.scale = attn.scale
        self.qkv = TangentLinear(attn.qkv, delta)
        self.proj = TangentLinear(attn.proj, delta)

    def _heads(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, n, _ = t.shape
        return t.reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        b, n, _ = x.shape
        qkv, qkv_d = self.qkv(x, xd)
        q, k, v = self._heads(qkv)
        if qkv_d is None:  # no tangent: plain (fused) attention
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
            return self.proj(out.transpose(1, 2).reshape(b, n, -1), None)
        attn = torch.softmax((q * self.scale) @ k.transpose(-2, -1), dim=-1)
        out = attn @ v
        q_d, k_d, v_d = self._heads(qkv_d)
        s_d = (q_d @ k.transpose(-2, -1) + q @ k_d.transpose(-2, -1)) * self.scale
        a_s = attn * s_d
        # Ȧ V = (A⊙Ṡ) V − rowsum(A⊙Ṡ) ⊙ (A V): the same Ȧ = A⊙Ṡ − A⊙rowsum(A⊙Ṡ), one N×N product fewer.
        out_d = a_s @ v - a_s.sum(-1, keepdim=True) * out + attn @ v_d
        return self.proj(out.transpose(1, 2).reshape(b, n, -1), out_d.transpose(1, 2).reshape(b, n, -1))


class TangentMlp(nn.Module):
    """Linearized timm ``Mlp``: ``fc2(GELU(fc1(x)))`` with the tangent layers above (dropouts are identity)."""

    def __init__(self, mlp: nn.Module, delta: bool = True) -> None:
        super().__init__()
        if not isinstance(mlp.norm, nn.Identity):
            raise ValueError("TangentMlp does not support an Mlp with an inner norm layer.")
        self.fc1 = TangentLinear(mlp.fc1, delta)
        self.act = TangentGELU(mlp.act)
        self.fc2 = TangentLinear(mlp.fc2, delta)

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        return self.fc2(*self.act(*self.fc1(x, xd)))


def tangent_layer_scale(module: nn.Module, delta: bool) -> nn.Module:
    """``TangentLayerScale`` for a timm ``LayerScale``, ``TangentIdentity`` for ``nn.Identity``."""
    if isinstance(module, LayerScale):
        return TangentLayerScale(module, delta)
    if isinstance(module, nn.Identity):
        return TangentIdentity()
    raise ValueError(f"unsupported layer-scale module {module!r}")


class TangentBlock(nn.Module):
    """Linearized pre-norm transformer block (timm ``Block``), residuals included::

        h = x + ls1(attn(norm1(x)))            ḣ = ẋ + ls1̇(...)
        y = h + ls2(mlp(norm2(h)))             ẏ = ḣ + ls2̇(...)

    DropPath is identity. ``x, ẋ, y, ẏ: (B, N, D)``.
    """

    def __init__(self, block: nn.Module, delta: bool = True) -> None:
        super().__init__()
        self.norm1 = TangentLayerNorm(block.norm1, delta)
        self.attn = TangentAttention(block.attn, delta)
        self.ls1 = tangent_layer_scale(block.ls1, delta)
        self.norm2 = TangentLayerNorm(block.norm2, delta)
        self.mlp = TangentMlp(block.mlp, delta)
        self.ls2 = tangent_layer_scale(block.ls2, delta)

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        h, hd = self.ls1(*self.attn(*self.norm1(x, xd)))
        x, xd = x + h, add_tangents(xd, hd)
        h, hd = self.ls2(*self.mlp(*self.norm2(x, xd)))
        return x + h, add_tangents(xd, hd)
