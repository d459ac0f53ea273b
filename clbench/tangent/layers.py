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
deterministic function of ``(x, Δ)``). Shapes: tokens ``(B, N, D)``; attention scores ``(B, N, N)`` per head.

Speed: a linear layer with both ``Δ`` and ``ẋ`` costs three GEMMs (``W0x``, ``ΔWx``, ``W0ẋ``), the floor of this
formulation, and tangent attention six batched products per head instead of two; everything else is kept to few
passes over memory. ``ẏ`` of a linear layer is accumulated by the GEMM itself (``addmm_``); GELU and LayerNorm have
symmetric Jacobians (``J ẋ = Jᵀ ẋ``), so their ``ẏ`` is their fused backward kernel applied to ``ẋ``; attention
runs on strided per-head views without copies. All of it is differentiable in ``(ẋ, Δ)``, so ``Δ`` trains through
it; the primal ``x`` is a constant for autograd (it never depends on ``Δ``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import LayerScale
from torch import Tensor, nn

from clbench.precision import float32

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
        if self.weight is None:
            return y, None if xd is None else F.linear(xd, self.weight0)
        yd = F.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)  # (M, D_out), M = all leading dims
        if xd is not None:  # ẏ += ẋ W0ᵀ inside the GEMM (β = 1): no separate pass adds the two terms
            yd.addmm_(xd.reshape(-1, xd.shape[-1]).to(yd.dtype), self.weight0.t().to(yd.dtype))
        return y, yd.view(y.shape)


class TangentGELU(nn.Module):
    """Linearized exact (erf) GELU ``y = x Φ(x)``:  ``ẏ = ẋ ⊙ (Φ(x) + x φ(x))`` with ``Φ`` the standard normal CDF
    ``Φ(x) = (1 + erf(x/√2))/2`` and ``φ(x) = exp(-x²/2)/√(2π)`` its density. Shapes are preserved.

    The Jacobian is diagonal, hence symmetric, so ``ẏ`` is GELU's backward kernel applied to ``ẋ``:
    ``aten.gelu_backward(ẋ, x)`` computes exactly this product in one fused pass.
    """

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        if not (isinstance(act, nn.GELU) and act.approximate == "none"):
            raise ValueError(f"TangentGELU linearizes the exact (erf) nn.GELU, got {act!r}.")

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        return F.gelu(x), None if xd is None else torch.ops.aten.gelu_backward(xd, x)


class _LayerNormJacobian(torch.autograd.Function):
    """``ẋ -> J ẋ`` for an affine-free LayerNorm over the last dimension at the point ``x`` (``mean``, ``rstd`` from
    its forward); ``J = (I − 11ᵀ/D − x̂x̂ᵀ/D)/σ`` is symmetric, so the backward is the same kernel: ``g -> J g``.

    The point ``x`` is a constant for autograd: in a tangent model the primal never depends on ``Δ``.
    """

    @staticmethod
    def forward(ctx, xd: Tensor, x: Tensor, mean: Tensor, rstd: Tensor) -> Tensor:
        if x.requires_grad:
            raise ValueError("the LayerNorm Jacobian-vector product is differentiable in ẋ only, not in the point x")
        ctx.save_for_backward(x, mean, rstd)
        return _layer_norm_jacobian(xd, x, mean, rstd)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return _layer_norm_jacobian(grad, *ctx.saved_tensors), None, None, None


def _layer_norm_jacobian(v: Tensor, x: Tensor, mean: Tensor, rstd: Tensor) -> Tensor:
    """``J v = (v − mean(v) − x̂ ⊙ mean(x̂ ⊙ v)) / σ``, LayerNorm's backward kernel (no affine) with ``v`` as the
    incoming gradient."""
    return torch.ops.aten.native_layer_norm_backward(v, x, x.shape[-1:], mean, rstd, None, None,
                                                     [True, False, False])[0]


class TangentLayerNorm(nn.Module):
    """Linearized LayerNorm over the last dimension ``D``.

    ``μ = mean(x)``, ``σ = sqrt(var(x) + ε)``, ``x̂ = (x − μ)/σ``, ``y = γ0 ⊙ x̂ + β0``. The derivative goes through
    the mean and the variance:

        dx̂ = (ẋ − mean(ẋ) − x̂ ⊙ mean(x̂ ⊙ ẋ)) / σ            ẏ = γ0 ⊙ dx̂ + Δγ ⊙ x̂ + Δβ

    with ``mean`` over ``D``; ``Δγ, Δβ: (D,)`` are the parameters ``weight`` / ``bias``. Both terms are fused kernels:
    ``Δγ ⊙ x̂ + Δβ`` is a LayerNorm of ``x`` with affine ``(Δγ, Δβ)``, and ``dx̂ = J ẋ`` with the symmetric
    Jacobian ``J = (I − 11ᵀ/D − x̂x̂ᵀ/D)/σ`` is LayerNorm's (affine-free) backward kernel applied to ``ẋ``.

    A bf16/fp16 ``x`` or ``ẋ`` (``--amp``: the outputs of autocast's bf16 GEMMs) is normalized in float32, and
    ``y, ẏ`` are float32, as CUDA autocast runs ``layer_norm``; the kernels need one dtype for ``ẋ``, ``x`` and
    the statistics.
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
        x, xd, shape = float32(x), float32(xd), x.shape[-1:]
        # Δγ ⊙ x̂ + Δβ (a LayerNorm without Δ has neither: Δβ exists only beside Δγ)
        yd = None if self.weight is None else F.layer_norm(x, shape, self.weight, self.bias, self.eps)
        if xd is None:
            return F.layer_norm(x, shape, self.weight0, self.bias0, self.eps), yd
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, self.weight0, self.bias0, self.eps)
        dxhat = _LayerNormJacobian.apply(xd, x, mean, rstd)
        if self.weight0 is None:
            return y, add_tangents(yd, dxhat)
        return y, dxhat * self.weight0 if yd is None else torch.addcmul(yd, dxhat, self.weight0)


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

    With ``[Q, K, V] = qkv(x)`` split into ``H`` heads of width ``d`` (per head ``Q, K, V: (B, N, d)``)::

        S = Q Kᵀ/√d                      Ṡ = (Q̇ Kᵀ + Q K̇ᵀ)/√d                       (B, N, N)
        A = softmax(S)  (rows)           Ȧ = A ⊙ Ṡ − A ⊙ rowsum(A ⊙ Ṡ)               (B, N, N)
        O = A V                          Ȯ = Ȧ V + A V̇                               (B, N, d)
        y = proj(concat_h O)             ẏ from the tangent ``proj``                  (B, N, D)

    ``Ȧ`` is the softmax Jacobian applied row by row in O(N²) per head (never the N²×N² Jacobian), and ``Ȧ V`` is
    computed as ``(A⊙Ṡ)V − rowsum(A⊙Ṡ) ⊙ O`` (one N×N product fewer). Each head reads ``Q, K, V`` as strided views of
    the ``qkv`` output, so no head-major copies are made; the six batched products per head accumulate in place.
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

    def _split(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(B, N, 3D) -> Q, K, V: (B, N, H, d)`` views."""
        b, n, _ = t.shape
        return t.view(b, n, 3, self.num_heads, self.head_dim).unbind(2)

    def _head(self, q: Tensor, k: Tensor, v: Tensor, q_d: Tensor, k_d: Tensor, v_d: Tensor) -> Pair:
        """One head, inputs ``(B, N, d)``: ``(O, Ȯ)``. With ``s = 1/√d`` and ``a_s = A ⊙ (Q̇Kᵀ + QK̇ᵀ) = A⊙Ṡ/s``,
        ``Ȯ = AV̇ + s·(a_s V − rowsum(a_s) ⊙ O)``."""
        attn = torch.softmax(torch.bmm(q, k.transpose(1, 2)).mul_(self.scale), dim=-1)
        a_s = torch.bmm(q_d, k.transpose(1, 2)).baddbmm_(q, k_d.transpose(1, 2)).mul_(attn)
        out = torch.bmm(attn, v)
        out_d = torch.bmm(attn, v_d).baddbmm_(a_s, v, alpha=self.scale)
        return out, out_d.addcmul_(a_s.sum(-1, keepdim=True), out, value=-self.scale)

    def forward(self, x: Tensor, xd: Tensor | None) -> Pair:
        b, n, _ = x.shape
        qkv, qkv_d = self.qkv(x, xd)
        if qkv_d is None:  # no tangent: plain (fused) attention
            q, k, v = (t.transpose(1, 2) for t in self._split(qkv))
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
            return self.proj(out.transpose(1, 2).reshape(b, n, -1), None)
        primal, tangent = self._split(qkv), self._split(qkv_d)
        heads = [self._head(*(t[:, :, h] for t in primal + tangent)) for h in range(self.num_heads)]
        return self.proj(torch.cat([o for o, _ in heads], -1), torch.cat([o_d for _, o_d in heads], -1))


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
