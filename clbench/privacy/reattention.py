"""Re-Attention (Ding et al., "Delving into Differentially Private Transformer", ICML 2024, Sec. 4).

DP-SGD adds Gaussian noise of the same scale to every coordinate of the summed gradient, but a parameter's signal
is summed over only the samples that use it. The paper models each parameter as carrying an error whose standard
deviation is its *effective error*

    σ_eff = σ_dp R / B_eff                                         (effective noise of one parameter)

with ``σ_dp`` the noise multiplier, ``R`` the clipping norm (the private gradient's noise is ``N(0, σ_dp² R² I)/B̄``,
:mod:`clbench.privacy.step`; the paper writes ``σ_dp / B_eff`` at ``R = 1``) and ``B_eff`` the expected number of
samples of a batch of size ``B`` that contribute to the parameter's gradient: ``B`` for dense parameters, ``B · p_j``
for the embedding row of token ``j`` that appears in a fraction ``p_j`` of the samples (a frequency prior:
:class:`ErrorPrior`). Rare tokens thus carry large errors, which a plain softmax turns into *attention distraction*:
for a query ``q`` and a key ``k_i ~ N(μ_i, σ_i² I)``

    E[exp⟨q, k_i⟩] = exp(⟨q, μ_i⟩) · exp(C σ_i² / 2),   C = ⟨q, q⟩,

so noisy keys are over-weighted on average. Re-Attention divides each unnormalized score by that factor and
renormalizes:

    S_i ← S_i / exp(C σ_i² / 2),    A_i = S_i / Σ_j S_j             (Re-Attention)

Here the scaled query ``q̃ = q / √d_h`` plays ``q`` (scores are ``⟨q̃, k⟩``), so ``C = ⟨q̃, q̃⟩ = ‖q‖² / d_h``, and
``σ_i²`` is the mean over the head's ``d_h`` dimensions of key ``i``'s tracked variance (the paper's isotropic
``σ_i² I``): :func:`score_correction`. Keys' variances come from **error tracking**: the variance of every
activation is propagated from the parameters' ``σ_eff²`` through the network by moment matching (as in
natural-parameter networks), each coordinate treated as independent (diagonal covariance); the activations actually
computed serve as the means:

- Linear ``y = W x + b`` with ``Var W_ij = s_W``, ``Var b_i = s_b``, ``Var x_j = v_j`` (all independent):
  ``Var y_i = Σ_j W_ij² v_j + s_W Σ_j (x_j² + v_j) + s_b``                                            (exact)
- Conv2d (a ViT's patch embedding: a Linear on each receptive field): the same rule per output position.
- LayerScale ``y = γ ⊙ x``: ``Var y_i = γ_i² v_i + s_γ (x_i² + v_i)``                                (exact)
- LayerNorm ``y = γ ⊙ x̂ + β``, ``x̂ = (x - m) / s``: first order in ``x`` (the diagonal of ``J diag(v) Jᵀ``,
  ``J = diag(γ)/s · (I - (1 + x̂ x̂ᵀ)/d)``) plus the parameters' errors, with the normalizer taken at its expected
  value under the noise, ``s² = Var_d(x) + (1 - 1/d) mean(v) + ε`` (without it the variance is over-estimated by
  ``≈ 1 + mean(v)/Var_d(x)``; checked against Monte Carlo in tests/test_privacy_reattention.py):
  ``Var y_i = (γ_i/s)² [v_i (1 - 2(1 + x̂_i²)/d) + (Σ_j v_j + 2 x̂_i Σ_j x̂_j v_j + x̂_i² Σ_j x̂_j² v_j)/d²]
  + s_γ x̂_i² + s_β``
- ReLU / GELU on ``N(μ, v)``: the exact variance of the output (ReLU: the rectified-Gaussian closed form;
  GELU: Gauss–Hermite quadrature with :data:`HERMITE_NODES` nodes).
- Attention output ``o_i = Σ_j A_ij V_j``: ``Var o_i = Σ_j A_ij² Var V_j`` (weights held fixed); residual sums add
  variances.

A parameter that is not trained (``requires_grad`` False) is not noised and carries no error: models pass
``s = 0`` for it. The variance path runs without gradients (it sets how much each score is discounted; the
discount's dependence on the query, ``C``, is differentiated). With ``σ_dp = 0`` every variance is 0 and
Re-Attention is vanilla attention exactly.

**Where the prior comes from.** A model that tracks errors exposes ``set_error_prior`` (:class:`ErrorTracking`).
The ``dp`` callback (:class:`clbench.privacy.step.PrivateTraining`), when it calibrates a training call, hands every
such module holding a prior among the strategy's modules the call's ``σ_dp``, ``R`` and expected batch ``B̄``
(:func:`with_noise`), keeping what the model's owner set beforehand (token frequencies, ``scale``; the owner's
``σ_dp`` stays in force without ``dp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

HERMITE_NODES = 16
_NODES, _WEIGHTS = np.polynomial.hermite.hermgauss(HERMITE_NODES)


@dataclass
class ErrorPrior:
    """The parameters' effective errors: dense parameters ``σ_eff = σ_dp R / B``; row ``j`` of a token embedding
    ``σ_eff = σ_dp R / (B · p_j)`` with ``p_j = token_frequency[j]`` (the fraction of samples containing token ``j``;
    a row with ``p_j = 0`` gets ``B_eff = 1``, one sample's worth). ``scale`` multiplies every ``σ_eff``; ``clip``
    is the clipping norm ``R``; ``token_frequency`` is None for a model without token embeddings (a ViT)."""

    sigma_dp: float
    batch_size: float
    token_frequency: Tensor | None = None          # (V,) in [0, 1]
    scale: float = 1.0
    clip: float = 1.0

    def __post_init__(self) -> None:
        if self.sigma_dp < 0 or self.batch_size <= 0 or self.scale < 0 or self.clip <= 0:
            raise ValueError(f"ErrorPrior needs sigma_dp >= 0, batch_size > 0, scale >= 0 and clip > 0; got "
                             f"{self.sigma_dp}, {self.batch_size}, {self.scale}, {self.clip}.")

    @property
    def dense_var(self) -> float:
        """``σ_eff²`` of a dense parameter."""
        return (self.scale * self.sigma_dp * self.clip / self.batch_size) ** 2

    def token_var(self) -> Tensor:
        """``(V,)`` ``σ_eff²`` of each embedding row."""
        if self.token_frequency is None:
            raise ValueError("ErrorPrior.token_var needs token_frequency (the embedding rows' frequency prior).")
        b_eff = (self.batch_size * self.token_frequency.double()).clamp(min=1.0)
        b_eff[self.token_frequency <= 0] = 1.0
        return ((self.scale * self.sigma_dp * self.clip / b_eff) ** 2).float()

    @property
    def active(self) -> bool:
        return self.sigma_dp * self.scale > 0


def with_noise(prior: ErrorPrior, sigma_dp: float, clip: float, batch_size: float) -> ErrorPrior:
    """``prior`` with the private step's noise ``(σ_dp, R, B̄)``; its token frequencies and ``scale`` kept."""
    return replace(prior, sigma_dp=sigma_dp, clip=clip, batch_size=batch_size)


@runtime_checkable
class ErrorTracking(Protocol):
    """A module that tracks activation variances from the :class:`ErrorPrior` it holds (``error_prior``) and uses
    them in Re-Attention. Holding a prior (even one with ``σ_dp = 0``) opts it in to the ``dp`` callback's noise;
    None: no tracking, and the callback leaves it alone."""

    error_prior: ErrorPrior | None

    def set_error_prior(self, prior: ErrorPrior | None) -> None: ...


# ------------------------------------------------------------------------------------------ moment propagation
def linear_var(x: Tensor, x_var: Tensor, layer: nn.Linear, weight_var: float, bias_var: float | None = None) -> Tensor:
    """``Var y`` of ``y = layer(x)`` for inputs ``x`` (means) with variances ``x_var``, weight entries of variance
    ``s_W = weight_var`` and bias entries of variance ``s_b = bias_var`` (None: ``weight_var``):
    ``Σ_j W_ij² v_j + s_W Σ_j (x_j² + v_j) + s_b``. Shapes ``(..., d_in) -> (..., d_out)``."""
    bias_var = weight_var if bias_var is None or layer.bias is None else bias_var
    out = F.linear(x_var, layer.weight.square())
    if weight_var:
        out = out + weight_var * (x.square() + x_var).sum(-1, keepdim=True)
    return out + bias_var if layer.bias is not None and bias_var else out


def conv2d_var(x: Tensor, x_var: Tensor, layer: nn.Conv2d, weight_var: float, bias_var: float | None = None) -> Tensor:
    """:func:`linear_var` of a Conv2d (``groups = 1``) on each receptive field: ``(B, C, H, W) -> (B, D, H', W')``,
    ``Var y = conv(v; W²) + s_W conv(x² + v; 1) + s_b``."""
    if layer.groups != 1 or not isinstance(layer.padding, tuple):
        raise ValueError(f"conv2d_var supports groups=1 and explicit padding, got {layer}.")
    bias_var = weight_var if bias_var is None else bias_var
    geometry = {"stride": layer.stride, "padding": layer.padding, "dilation": layer.dilation}
    out = F.conv2d(x_var, layer.weight.square(), **geometry)
    if weight_var:
        out = out + weight_var * F.conv2d(x.square() + x_var, torch.ones_like(layer.weight[:1]), **geometry)
    return out + bias_var if layer.bias is not None and bias_var else out


def layer_scale_var(x: Tensor, x_var: Tensor, gamma: Tensor, gamma_var: float) -> Tensor:
    """``Var y`` of ``y = γ ⊙ x`` (LayerScale): ``γ² v + s_γ (x² + v)``."""
    return gamma.square() * x_var + gamma_var * (x.square() + x_var)


def layer_norm_var(x: Tensor, x_var: Tensor, layer: nn.LayerNorm, weight_var: float,
                   bias_var: float | None = None) -> Tensor:
    """``Var y`` of ``y = layer(x)`` over the last dimension ``d`` (first order in ``x``; exact in ``γ, β``, whose
    entries have variances ``s_γ = weight_var``, ``s_β = bias_var``, None: ``weight_var``)."""
    d = x.shape[-1]
    mean = x.mean(-1, keepdim=True)
    std = (x.var(-1, unbiased=False, keepdim=True) + x_var.mean(-1, keepdim=True) * (1 - 1 / d) + layer.eps).sqrt()
    xhat = (x - mean) / std
    s0 = x_var.sum(-1, keepdim=True)
    s1 = (xhat * x_var).sum(-1, keepdim=True)
    s2 = (xhat.square() * x_var).sum(-1, keepdim=True)
    own = x_var * (1 - 2 * (1 + xhat.square()) / d) + (s0 + 2 * xhat * s1 + xhat.square() * s2) / d**2
    gamma = layer.weight if layer.weight is not None else torch.ones(d, dtype=x.dtype, device=x.device)
    out = (gamma / std).square() * own
    if layer.weight is not None and weight_var:
        out = out + weight_var * xhat.square()
    bias_var = weight_var if bias_var is None else bias_var
    return out + bias_var if layer.bias is not None and bias_var else out


def _relu_var(mu: Tensor, var: Tensor) -> Tensor:
    """Variance of ``max(X, 0)`` for ``X ~ N(μ, v)`` (rectified Gaussian)."""
    sd = var.clamp(min=1e-30).sqrt()
    a = mu / sd
    cdf = 0.5 * (1 + torch.erf(a / math.sqrt(2)))
    pdf = torch.exp(-0.5 * a.square()) / math.sqrt(2 * math.pi)
    m1 = mu * cdf + sd * pdf
    m2 = (mu.square() + var) * cdf + mu * sd * pdf
    return torch.where(var > 0, (m2 - m1.square()).clamp(min=0), torch.zeros_like(var))


def _quadrature_var(fn, mu: Tensor, var: Tensor) -> Tensor:
    """Variance of ``fn(X)`` for ``X ~ N(μ, v)`` by Gauss–Hermite quadrature, ``E[g(X)] ≈ Σ_k w_k g(μ + √(2v) x_k)
    / √π``, accumulated node by node (memory of a few copies of ``μ``, not :data:`HERMITE_NODES` of them)."""
    spread = (2 * var).sqrt()
    m1, m2 = torch.zeros_like(mu), torch.zeros_like(mu)
    for node, weight in zip(_NODES.tolist(), (_WEIGHTS / math.sqrt(math.pi)).tolist()):
        value = fn(torch.add(mu, spread, alpha=node))
        m1.add_(value, alpha=weight)
        m2.addcmul_(value, value, value=weight)
    return (m2 - m1.square()).clamp(min=0)


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
ACTIVATION_VARS = {"relu": _relu_var, "gelu": lambda mu, var: _quadrature_var(F.gelu, mu, var)}


def activation_var(kind: str, mu: Tensor, var: Tensor) -> Tensor:
    """Variance of ``act(X)`` for ``X ~ N(μ, v)``, ``act`` one of :data:`ACTIVATIONS` (moment matching)."""
    return ACTIVATION_VARS[kind](mu, var)


def score_correction(q: Tensor, k_var: Tensor) -> Tensor:
    """``(B, H, L, L)`` what Re-Attention subtracts from the logits ``⟨q̃_i, k_j⟩``: ``C_i σ_j² / 2`` with
    ``C_i = ⟨q̃_i, q̃_i⟩`` (``q = q̃: (B, H, L, d_h)``, differentiated) and ``σ_j²`` the mean over ``d_h`` of
    ``k_var: (B, H, L, d_h)``, the variances of the keys. ``exp`` of it is the factor each score ``S_ij`` is divided
    by; the softmax renormalizes."""
    return q.square().sum(-1, keepdim=True) * k_var.mean(-1)[:, :, None, :] / 2


# --------------------------------------------------------------------------------------------------- attention
class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate ``q, k, v, proj`` Linear layers (so that per-sample
    gradient norms see ordinary Linear layers). ``x: (B, L, d)``, ``pad: (B, L)`` True at padding: a query attends
    to keys ``j ≤ i`` that are not padding, and always to itself (padding rows stay finite)."""

    def __init__(self, dim: int, heads: int = 1, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}.")
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))
        self.dropout = nn.Dropout(dropout)

    def _split(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)            # (B, H, L, d_h)

    def correction(self, q: Tensor, x: Tensor, x_var: Tensor | None, param_var: float) -> Tensor | float:
        """``log`` of the factor each score is divided by; vanilla attention: 0."""
        return 0.0

    def forward(self, x: Tensor, pad: Tensor, x_var: Tensor | None = None, param_var: float = 0.0,
                track: bool = True) -> tuple[Tensor, Tensor | None]:
        """``(out (B, L, d), Var out or None)``; ``x_var``: variances of ``x`` (error tracking) or None;
        ``track=False``: use ``x_var`` for the scores only and return no output variance (the last block)."""
        b, n, d = x.shape
        q = self._split(self.q(x)) / math.sqrt(self.head_dim)                     # q̃ = q / √d_h
        k, v = self._split(self.k(x)), self._split(self.v(x))
        scores = q @ k.transpose(-1, -2)                                           # (B, H, L, L): ⟨q̃_i, k_j⟩
        scores = scores - self.correction(q, x, x_var, param_var)
        eye = torch.eye(n, dtype=torch.bool, device=x.device)
        allowed = torch.ones(n, n, dtype=torch.bool, device=x.device).tril() & ~pad[:, None, None, :] | eye
        attn = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out = (self.dropout(attn) @ v).transpose(1, 2).reshape(b, n, d)
        out_var = None
        if x_var is not None and track:
            with torch.no_grad():
                v_var = self._split(linear_var(x, x_var, self.v, param_var))
                o_var = (attn.square() @ v_var).transpose(1, 2).reshape(b, n, d)
                out_var = linear_var(out, o_var, self.proj, param_var)
        return self.proj(out), out_var


class ReAttention(CausalSelfAttention):
    """:class:`CausalSelfAttention` whose scores are corrected for the keys' tracked variances (module docstring):
    ``⟨q̃_i, k_j⟩ - C_i σ_j² / 2`` before the softmax, ``C_i = ⟨q̃_i, q̃_i⟩``, ``σ_j²`` the mean variance of key
    ``j`` over the head's dimensions. Same parameters as the vanilla module (a drop-in replacement)."""

    def correction(self, q: Tensor, x: Tensor, x_var: Tensor | None, param_var: float) -> Tensor | float:
        if x_var is None:
            return 0.0
        with torch.no_grad():
            k_var = self._split(linear_var(x, x_var, self.k, param_var))              # (B, H, L, d_h)
        return score_correction(q, k_var)


ATTENTIONS = {"vanilla": CausalSelfAttention, "reattention": ReAttention}

__all__ = ["ACTIVATIONS", "ATTENTIONS", "CausalSelfAttention", "ErrorPrior", "ErrorTracking", "ReAttention",
           "activation_var", "conv2d_var", "layer_norm_var", "layer_scale_var", "linear_var", "score_correction",
           "with_noise"]
