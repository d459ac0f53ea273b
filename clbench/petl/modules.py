"""The PETL modules and one module set (:class:`PETLSet`): every trainable parameter of a method, for all blocks.

Symbols as in :mod:`clbench.petl.config`: ``d`` width, ``r`` bottleneck/rank, ``l`` prefix length, ``N_h`` heads,
``d_h = d / N_h``, ``m`` FFN hidden width, ``L`` blocks, ``s`` scale. Shapes: tokens ``(B, N, d)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from clbench.petl.config import Modification, PETLConfig, ViTShape


class Adapter(nn.Module):
    """``Δh = s · (f(z W_down + b_down) W_up + b_up)``, ``f`` = ReLU: ``(B, N, d) -> (B, N, d)``.

    ``z`` is the sublayer output ``h`` (``sequential``) or its input ``x`` (parallel); the caller picks it from
    :attr:`sequential`. ``W_up`` and ``b_up`` start at 0 (so ``Δh = 0``); ``W_down`` has ``nn.Linear``'s init."""

    def __init__(self, dim: int, r: int, scale: float = 1.0, sequential: bool = False) -> None:
        super().__init__()
        self.down = nn.Linear(dim, r)
        self.up = nn.Linear(r, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.scale, self.sequential = scale, sequential

    def forward(self, z: Tensor) -> Tensor:
        return self.scale * self.up(F.relu(self.down(z)))


class MultiHeadAdapter(nn.Module):
    """Per-head parallel adapter: ``Δz_i = s · (f(x W_down^(i) + b_down^(i)) W_up^(i) + b_up^(i))`` for head ``i``,
    ``W_down^(i): (d, r)``, ``W_up^(i): (r, d_h)``; ``(B, N, d) -> (B, N, N_h, d_h)``, added to the heads'
    attention outputs before ``W_o``. ``W_up``, ``b_up`` start at 0."""

    def __init__(self, dim: int, heads: int, r: int, scale: float = 1.0) -> None:
        super().__init__()
        bound = 1 / math.sqrt(dim)                        # nn.Linear's default init, per head
        self.w_down = nn.Parameter(torch.empty(heads, dim, r).uniform_(-bound, bound))
        self.b_down = nn.Parameter(torch.empty(heads, r).uniform_(-bound, bound))
        self.w_up = nn.Parameter(torch.zeros(heads, r, dim // heads))
        self.b_up = nn.Parameter(torch.zeros(heads, dim // heads))
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.relu(torch.einsum("bnd,hdr->bnhr", x, self.w_down) + self.b_down)
        return self.scale * (torch.einsum("bnhr,hrk->bnhk", hidden, self.w_up) + self.b_up)


class LoRA(nn.Module):
    """Low-rank update of a Linear ``W: (out, in)`` on some of its output rows: for each target ``t`` (rows
    ``segments[t] = (start, stop)``), ``Δy[..., start:stop] = s · x A_t^T B_t^T`` with ``A_t: (r, in)`` (Kaiming
    uniform, as LoRA) and ``B_t: (stop - start, r)`` = 0; other rows get 0. :meth:`delta_weight` is the merged
    ``ΔW`` with ``W x + Δy = (W + ΔW) x``. ``Δy`` is added to the target rows only (no full-width zero blocks),
    out of place: autograd hooks on the result (per-sample clipping) need a tensor that did not turn into one
    requiring gradients through an in-place write into a view.

    timm's fused ``qkv`` Linear ``(3d, d)`` with LoRA on ``W_q`` and ``W_v``: ``segments = ((0, d), (2d, 3d))``."""

    def __init__(self, in_features: int, out_features: int, segments: tuple[tuple[int, int], ...], r: int,
                 scale: float) -> None:
        super().__init__()
        self.in_features, self.out_features, self.segments, self.r, self.scale = (
            in_features, out_features, tuple(segments), r, scale)
        self.A = nn.Parameter(torch.empty(len(segments) * r, in_features))
        for a in self.A.split(r):
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.B = nn.Parameter(torch.zeros(sum(stop - start for start, stop in segments), r))

    def _b_blocks(self) -> tuple[Tensor, ...]:
        return self.B.split([stop - start for start, stop in self.segments])

    def forward(self, out: Tensor, x: Tensor) -> Tensor:
        """``out + Δy``: ``Δy`` added to the target rows of ``out = W x + b`` ``(..., out)`` (the other rows as they
        are); ``x: (..., in)``."""
        low = F.linear(x, self.A).split(self.r, dim=-1)                     # (..., r) per target
        parts, done = [], 0
        for (start, stop), h, b in zip(self.segments, low, self._b_blocks()):
            parts += [out[..., done:start], out[..., start:stop] + self.scale * F.linear(h, b)]
            done = stop
        return torch.cat([*parts, out[..., done:]], dim=-1)

    @torch.no_grad()
    def delta_weight(self) -> Tensor:
        """``ΔW = s · B_t A_t`` on each target's rows, 0 elsewhere: ``(out, in)``."""
        delta = self.A.new_zeros(self.out_features, self.in_features)
        for (start, stop), a, b in zip(self.segments, self.A.split(self.r), self._b_blocks()):
            delta[start:stop] = self.scale * b @ a
        return delta


class PrefixBank(nn.Module):
    """Prefix vectors of every block: :meth:`forward` gives ``(B, L, 2, l, d)`` (``[:, :, 0]`` keys ``P_k``,
    ``[:, :, 1]`` values ``P_v``), the same for every sample: an expanded view over the batch, so that each sample's
    use of the prefixes has its own gradient (what per-sample clipping reads, :mod:`clbench.petl.rules`).
    Free vectors start ~ N(0, 0.02²); with ``reparam = k > 0`` they are ``MLP(E) = tanh(E W_1 + b_1) W_2 + b_2``
    reshaped, ``E: (l, d)`` ~ N(0, 1) (``nn.Embedding``'s init), ``W_1: (d, k)``, ``W_2: (k, 2Ld)`` (Li & Liang's
    reparametrization as in He et al.'s code)."""

    def __init__(self, depth: int, length: int, dim: int, reparam: int = 0) -> None:
        super().__init__()
        self.depth, self.length, self.dim = depth, length, dim
        if reparam:
            self.embedding = nn.Parameter(torch.randn(length, dim))
            self.mlp = nn.Sequential(nn.Linear(dim, reparam), nn.Tanh(), nn.Linear(reparam, 2 * depth * dim))
        else:
            self.prefix = nn.Parameter(torch.randn(depth, 2, length, dim) * 0.02)

    def forward(self, batch: int) -> Tensor:
        if hasattr(self, "mlp"):
            out = self.mlp(self.embedding)                                   # (l, 2Ld)
            prefix = out.view(self.length, self.depth, 2, self.dim).permute(1, 2, 0, 3)
        else:
            prefix = self.prefix
        return prefix.expand(batch, *prefix.shape)

    @property
    def reparametrized(self) -> bool:
        return hasattr(self, "mlp")

    @torch.no_grad()
    def merge(self) -> None:
        """Drop the reparametrization after training (He et al.'s code saves the prefixes, not the MLP): the free
        vectors become ``MLP(E)`` reshaped to ``(L, 2, l, d)``, so :meth:`forward` gives the same values."""
        if not self.reparametrized:
            return
        trainable = self.embedding.requires_grad
        prefix = self.forward(1)[0].detach().clone()
        del self.embedding, self.mlp
        self.prefix = nn.Parameter(prefix, requires_grad=trainable)


def _block_modules(m: Modification, shape: ViTShape) -> dict[str, nn.Module]:
    """The modules one modification puts in one block, keyed by where the hooks look them up."""
    d, r = shape.dim, m.size
    if m.form == "adapter":
        if m.representation == "heads":
            return {"heads": MultiHeadAdapter(d, shape.heads, r, m.scale)}
        return {m.representation: Adapter(d, r, m.scale, sequential=m.insertion == "sequential")}
    if m.representation == "attn":                                          # LoRA on W_q, W_v of the fused qkv
        return {"qkv": LoRA(d, 3 * d, ((0, d), (2 * d, 3 * d)), r, m.scale)}
    hidden = shape.mlp_hidden
    return {"fc1": LoRA(d, hidden, ((0, hidden),), r, m.scale), "fc2": LoRA(hidden, d, ((0, d),), r, m.scale)}


class PETLSet(nn.Module):
    """One set of PETL modules for a ViT of ``shape``: ``prefix`` (a :class:`PrefixBank` or None) and
    ``blocks[i]``, a ``ModuleDict`` whose keys (``attn``, ``ffn``, ``heads``, ``qkv``, ``fc1``, ``fc2``) are where
    the hooks of :mod:`clbench.petl.inject` look. Its parameter count equals ``config.trainable_count(shape)``, plus
    the ViT's own with ``backbone``: full fine-tuning's trainable copy of the ViT (``config.train_backbone``; made by
    :meth:`clbench.petl.PETLViT.new_set`), which then runs in place of the frozen one. The copy stays in eval mode,
    as the frozen backbone does (no dropout or drop path in any row of the family)."""

    def __init__(self, config: PETLConfig, shape: ViTShape, backbone: nn.Module | None = None) -> None:
        super().__init__()
        if backbone is not None and not config.train_backbone:
            raise ValueError("a backbone copy belongs to a full fine-tuning set (config.train_backbone) only.")
        self.config, self.shape = config, shape
        self.backbone = backbone.eval() if backbone is not None else None
        prefix = [m for m in config.modifications if m.form == "prefix"]
        self.prefix = PrefixBank(shape.depth, prefix[0].size, shape.dim, prefix[0].reparam) if prefix else None
        self.blocks = nn.ModuleList()
        for _ in range(shape.depth):
            modules: dict[str, nn.Module] = {}
            for m in config.modifications:
                if m.form != "prefix":
                    modules.update(_block_modules(m, shape))
            self.blocks.append(nn.ModuleDict(modules))

    def train(self, mode: bool = True) -> PETLSet:
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def merge_prefix(self) -> PETLSet:
        """Merges a reparametrized prefix into its vectors (:meth:`PrefixBank.merge`); returns ``self``."""
        if self.prefix is not None:
            self.prefix.merge()
        return self
