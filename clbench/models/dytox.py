"""DyTox network (Douillard et al., CVPR 2022): a shared encoder, one task-attention decoder, one task token and
one independent classifier per task.

Shapes use the paper's symbols: ``B`` images, ``N`` patches, ``D`` embedding dimension, ``t`` tasks seen,
``|C_i|`` classes of task ``i``.

    x_0 = PatchEmbed(x) + pos                          (B, N, D)      patch tokenizer, one conv
    x_l = SAB_l(x_{l-1}),  l = 1..L                    (B, N, D)      encoder, run ONCE per image
    e_i = TAB([θ_i ; x_L]),  i = 1..t                  (B, D)         decoder, run once per task token θ_i
    ŷ_i = Clf_i(e_i) = W_i LN_i(e_i) + b_i             (B, |C_i|)     independent classifiers
    ŷ   = [ŷ_1, ..., ŷ_t]                              (B, |C_1:t|)   sigmoid activations (BCE) in training

The TAB is CaiT's class-attention block: with ``z = [θ_i ; x_L]`` the query comes from the task token only,
``c' = c + TA(LN(z))``, ``c'' = c' + MLP(LN(c'))``, ``TA(z) = softmax(q kᵀ / √d_h) v`` with ``q = W_q c``,
``k = W_k z``, ``v = W_v z``.

Adding a task adds one token θ_t ∈ R^D and one classifier Clf_t (LN + linear): nothing else grows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import Tensor, nn

from clbench.models.gpsa import GPSA
from clbench.protocol import ClassificationInfo
from clbench.registry import MODELS


@dataclass(frozen=True)
class DyToxArch:
    """Architecture of the DyTox network. ``depth`` counts the SABs (the single TAB comes on top)."""

    embed_dim: int = 384
    depth: int = 5
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = False
    drop_path: float = 0.1
    patch_size: int = 4
    attention: str = "gpsa"              # "gpsa" (ConViT, the official CIFAR model) or "plain" (standard MHSA)
    locality_strength: float = 1.0


ARCHS: dict[str, DyToxArch] = {
    "cifar": DyToxArch(),                                        # 5 SAB + 1 TAB, dim 384, 12 heads, 32px patch 4
    "imagenet": DyToxArch(patch_size=16),                        # same, 224px patch 16
    "tiny": DyToxArch(embed_dim=64, depth=3, num_heads=4),       # CPU scale: 3 SAB + 1 TAB, dim 64
}


# ---------------------------------------------------------------------------------------------------- attention
class SelfAttention(nn.Module):
    """Plain multi-head self-attention ``softmax(Q Kᵀ / √d_h) V W_out`` over ``(B, N, D)``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        batch, n, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, n, 3, self.num_heads, dim // self.num_heads).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, n, dim))


class TaskAttention(nn.Module):
    """Class attention (CaiT): ``TA(z) = softmax(q kᵀ / √d_h) v`` with the query from ``z[:, :1]`` (the task
    token) and keys/values from all of ``z = [θ_i ; x_L]`` of shape ``(B, 1 + N, D)``; returns ``(B, 1, D)``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, z: Tensor) -> Tensor:
        batch, n, dim = z.shape
        heads = lambda y: y.reshape(batch, -1, self.num_heads, dim // self.num_heads).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(heads(self.q(z[:, :1])), heads(self.k(z)), heads(self.v(z)))
        return self.proj(out.transpose(1, 2).reshape(batch, 1, dim))


# ------------------------------------------------------------------------------------------------------- blocks
class SelfAttentionBlock(nn.Module):
    """SAB: ``x' = x + DropPath(SA(LN(x)))``, ``x'' = x' + DropPath(MLP(LN(x')))`` with SA = GPSA or MHSA."""

    def __init__(self, arch: DyToxArch, grid: tuple[int, int], drop_path: float) -> None:
        super().__init__()
        dim = arch.embed_dim
        self.norm1 = nn.LayerNorm(dim)
        self.attn = (GPSA(dim, arch.num_heads, grid, arch.qkv_bias, arch.locality_strength)
                     if arch.attention == "gpsa" else SelfAttention(dim, arch.num_heads, arch.qkv_bias))
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * arch.mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class TaskAttentionBlock(nn.Module):
    """TAB: for ``z = [c ; x_L]`` of shape ``(B, 1 + N, D)``, ``c' = c + DropPath(TA(LN(z)))`` and
    ``c'' = c' + DropPath(MLP(LN(c')))``; returns the task embedding ``e = c''`` of shape ``(B, D)``."""

    def __init__(self, arch: DyToxArch, drop_path: float) -> None:
        super().__init__()
        dim = arch.embed_dim
        self.norm1 = nn.LayerNorm(dim)
        self.attn = TaskAttention(dim, arch.num_heads, arch.qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * arch.mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, z: Tensor) -> Tensor:
        c = z[:, :1] + self.drop_path(self.attn(self.norm1(z)))
        c = c + self.drop_path(self.mlp(self.norm2(c)))
        return c[:, 0]


class TaskClassifier(nn.Module):
    """``Clf_i(e_i) = W_i LN_i(e_i) + b_i``: ``(B, D) -> (B, n_classes)``. Also the divergence head's form.

    ``W_i`` and ``b_i`` keep PyTorch's default ``nn.Linear`` initialization, ``U(±1/√D)``, as the official
    ``ContinualClassifier`` does (it is created when a task starts and never passes through the ViT init). Do NOT
    re-initialize it with the backbone's ``trunc_normal(0.02)``: at small ``D`` that makes a new head ~5x weaker
    (std 0.02 vs 1/√(3D) = 0.10 at D = 32), its gradient into the shared TAB is swamped by the old heads' and the new
    task embedding collapses to a constant within a few updates, so every new task scored 0% (``docs/dytox.md``).
    """

    def __init__(self, dim: int, n_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)          # default init U(-1/√D, 1/√D) for weight and bias

    def forward(self, e: Tensor) -> Tensor:
        return self.head(self.norm(e))


def _init_weights(module: nn.Module) -> None:
    """ViT/ConViT initialization: ``trunc_normal(0.02)`` linear weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# ------------------------------------------------------------------------------------------------------ network
class DyToxEncoder(nn.Module):
    """Patch tokenizer + positional embedding + ``L`` SABs: ``(B, C, H, W) -> x_L`` of shape ``(B, N, D)``."""

    def __init__(self, arch: DyToxArch, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        channels, height, width = input_shape
        if height % arch.patch_size or width % arch.patch_size:
            raise ValueError(f"DyTox: patch_size {arch.patch_size} does not divide the image size {height}x{width}.")
        grid = (height // arch.patch_size, width // arch.patch_size)
        self.patch_embed = nn.Conv2d(channels, arch.embed_dim, kernel_size=arch.patch_size, stride=arch.patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1], arch.embed_dim))
        rates = torch.linspace(0, arch.drop_path, arch.depth + 1).tolist()     # stochastic depth over SABs + TAB
        self.blocks = nn.ModuleList(SelfAttentionBlock(arch, grid, rates[i]) for i in range(arch.depth))
        trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return x


@dataclass
class DyToxOutput:
    """``logits`` ``(B, |C_1:t|)`` (column c = class c) and the task embeddings ``[e_1, ..., e_t]``, each ``(B, D)``."""

    logits: Tensor
    embeddings: list[Tensor]


class DyToxNet(nn.Module):
    """The DyTox network. It starts with no task: call :meth:`add_task` with ``|C_t|`` when task ``t`` starts."""

    def __init__(self, arch: DyToxArch, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.arch = arch
        self.encoder = DyToxEncoder(arch, input_shape)
        self.tab = TaskAttentionBlock(arch, drop_path=arch.drop_path)
        self.task_tokens = nn.ParameterList()
        self.heads = nn.ModuleList()
        self.apply(_init_weights)                       # before any head exists: heads keep their own init
        for module in self.modules():
            if isinstance(module, GPSA):
                module.local_init()

    @property
    def n_tasks(self) -> int:
        return len(self.task_tokens)

    @property
    def classes_per_task(self) -> list[int]:
        return [head.head.out_features for head in self.heads]

    def add_task(self, n_classes: int) -> None:
        """Create θ_t and Clf_t (``D`` + ``2D + D·|C_t| + |C_t|`` parameters). The first token is learned from a
        ``trunc_normal(0.02)`` draw; later ones are a copy of θ_{t-1} re-initialized with ``trunc_normal(0.02)``
        (the copy only fixes shape, device and dtype: all values are redrawn)."""
        like = self.task_tokens[-1] if self.n_tasks else self.encoder.pos_embed[:, :1]
        token = nn.Parameter(torch.empty_like(like.detach()))
        trunc_normal_(token, std=0.02)
        self.task_tokens.append(token)
        self.heads.append(TaskClassifier(self.arch.embed_dim, n_classes).to(like.device))

    def decode(self, x_L: Tensor) -> list[Tensor]:
        """``e_i = TAB([θ_i ; x_L])`` for every task token: one TAB pass per token, shared weights."""
        batch = x_L.shape[0]
        return [self.tab(torch.cat((token.expand(batch, -1, -1), x_L), dim=1)) for token in self.task_tokens]

    def classify(self, embeddings: list[Tensor]) -> Tensor:
        """``ŷ = [Clf_1(e_1), ..., Clf_t(e_t)]`` of shape ``(B, |C_1:t|)``."""
        return torch.cat([head(e) for head, e in zip(self.heads, embeddings)], dim=1)

    def forward(self, x: Tensor) -> DyToxOutput:
        if not self.n_tasks:
            raise RuntimeError("DyToxNet has no task yet: call add_task(n_classes) first.")
        embeddings = self.decode(self.encoder(x))
        return DyToxOutput(self.classify(embeddings), embeddings)

    def set_trainable(self, old_tasks: bool = True, encoder: bool = True) -> None:
        """Freeze (``requires_grad = False`` and eval mode, so stochastic depth is off) the old task tokens and
        classifiers ``θ_1..θ_{t-1}``, ``Clf_1..Clf_{t-1}`` and/or the encoder; everything else trains."""
        self.train()
        self.requires_grad_(True)
        if not old_tasks:
            for token in list(self.task_tokens)[:-1]:
                token.requires_grad_(False)
            for head in list(self.heads)[:-1]:
                head.requires_grad_(False).eval()
        if not encoder:
            self.encoder.requires_grad_(False).eval()


@MODELS.register("dytox")
def dytox(info: ClassificationInfo, *, arch: str = "tiny", **overrides) -> DyToxNet:
    """A DyTox network for ``info.input_shape``: one of :data:`ARCHS` with field overrides (``patch_size=2``...)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown DyTox arch {arch!r}; known: {', '.join(ARCHS)}.")
    return DyToxNet(replace(ARCHS[arch], **overrides), info.input_shape)
