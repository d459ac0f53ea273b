"""Gated positional self-attention (GPSA) of ConViT (d'Ascoli et al., ICML 2021), used by DyTox's encoder.

For ``N`` patch tokens on an ``h x w`` grid, head ``h`` mixes a content attention and a positional attention:

    A^h = (1 - σ(λ_h)) · softmax(Q^h K^hᵀ / √d_h) + σ(λ_h) · softmax(v_posᵀ r_ij)
    GPSA(X) = concat_h( normalize(A^h) X W_val^h ) W_out

where ``r_ij = (Δx, Δy, Δx² + Δy²)`` is the relative position of patch ``j`` seen from patch ``i``, ``v_pos^h``
the head's learned positional query (a row of ``pos_proj``) and ``λ_h`` its gating parameter (initialized at 1).
The "local init" with locality strength ``α`` places the attention centers of the first ``⌊√H⌋²`` heads on a
``⌊√H⌋ x ⌊√H⌋`` grid around each query patch, ``v_pos^h = α · (2Δ_h^x, 2Δ_h^y, -1)``, and sets
``W_val = I`` so that a freshly initialized GPSA layer behaves like a convolution.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_positions(height: int, width: int) -> Tensor:
    """``r`` of shape ``(N, N, 3)`` with ``N = height * width``: ``r[i, j] = (Δx, Δy, Δx² + Δy²)`` for patch ``j``
    relative to patch ``i`` (patches in row-major order)."""
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    ys, xs = ys.flatten().float(), xs.flatten().float()
    dx = xs[None, :] - xs[:, None]
    dy = ys[None, :] - ys[:, None]
    return torch.stack((dx, dy, dx ** 2 + dy ** 2), dim=-1)


class GPSA(nn.Module):
    """Gated positional self-attention over patch tokens ``(B, N, D)`` laid out on a ``grid = (h, w)``.

    ``qkv_bias`` applies to the query/key and value projections. Call :meth:`local_init` after any generic
    weight initialization (ConViT re-applies it after ``trunc_normal`` of all linear layers).
    """

    def __init__(self, dim: int, num_heads: int, grid: tuple[int, int], qkv_bias: bool = False,
                 locality_strength: float = 1.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"GPSA: dim {dim} is not divisible by num_heads {num_heads}.")
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.locality_strength = locality_strength
        self.qk = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.pos_proj = nn.Linear(3, num_heads)
        self.gating_param = nn.Parameter(torch.ones(num_heads))
        self.register_buffer("rel_pos", relative_positions(*grid), persistent=False)
        self.local_init()

    @torch.no_grad()
    def local_init(self) -> None:
        """``W_val = I``; attention centers of the first ``k² = ⌊√H⌋²`` heads at offsets ``(Δx, Δy)`` on a
        centered ``k x k`` grid: ``v_pos^h = α · (2Δx, 2Δy, -1)``."""
        self.v.weight.copy_(torch.eye(self.v.weight.shape[0]))
        kernel = int(math.sqrt(self.num_heads))
        center = (kernel - 1) / 2
        for row in range(kernel):
            for col in range(kernel):
                head = row + kernel * col
                self.pos_proj.weight[head] = torch.tensor([2 * (col - center), 2 * (row - center), -1.0])
        self.pos_proj.weight.mul_(self.locality_strength)

    def attention(self, x: Tensor) -> Tensor:
        """The normalized gated attention map ``(B, H, N, N)``."""
        batch, n, dim = x.shape
        q, k = self.qk(x).reshape(batch, n, 2, self.num_heads, dim // self.num_heads).permute(2, 0, 3, 1, 4)
        content = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        positional = self.pos_proj(self.rel_pos).permute(2, 0, 1).softmax(dim=-1)      # (H, N, N)
        gate = torch.sigmoid(self.gating_param).view(1, -1, 1, 1)
        attn = (1.0 - gate) * content + gate * positional
        return attn / attn.sum(dim=-1, keepdim=True)

    def forward(self, x: Tensor) -> Tensor:
        batch, n, dim = x.shape
        v = self.v(x).reshape(batch, n, self.num_heads, dim // self.num_heads).transpose(1, 2)
        out = (self.attention(x) @ v).transpose(1, 2).reshape(batch, n, dim)
        return self.proj(out)
