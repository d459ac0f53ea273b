"""Transformers written the usual PyTorch way (nn.TransformerEncoderLayer / nn.TransformerDecoderLayer, bare
nn.Parameters for positional tables and class tokens, tied input/output embeddings), for private training: the zoo
that tests/test_privacy.py checks against vmap's per-sample gradients and benchmarks/dp_cost.py times
(a test helper: the benchmark puts the repository first on its path to import it).

Every model maps a batch (sample dimension first) to scores; sizes are arguments (``Sizes``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clbench.privacy.packing import rows_of


@dataclass(frozen=True)
class Sizes:
    """Vocabulary ``vocab``, sequence length ``length``, width ``dim``, ``heads``, feed-forward width ``ff``,
    ``layers``, ``classes`` of the classifiers, image side ``image`` (patch 4) and feature width ``features`` of the
    decoder's memory."""

    vocab: int = 11
    length: int = 6
    dim: int = 8
    heads: int = 2
    ff: int = 12
    layers: int = 2
    classes: int = 3
    image: int = 8
    features: int = 5


def encoder_layer(s: Sizes, batch_first: bool, **kw) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(s.dim, s.heads, dim_feedforward=s.ff, dropout=0.0, batch_first=batch_first, **kw)


class Encoder(nn.Module):
    """Token ids ``(B, T)`` -> embedding + positional table (a bare parameter) -> nn.TransformerEncoder -> mean ->
    linear head ``(B, classes)``. ``batch_first=False``: the encoder runs on ``(T, B, D)`` (transposed in and out);
    ``padding``: ids 0 are masked keys."""

    def __init__(self, s: Sizes, batch_first: bool, padding: bool = False, **kw) -> None:
        super().__init__()
        self.batch_first, self.padding = batch_first, padding
        self.embed = nn.Embedding(s.vocab, s.dim)
        self.pos = nn.Parameter(torch.zeros(1, s.length, s.dim))
        self.encoder = nn.TransformerEncoder(encoder_layer(s, batch_first, **kw), num_layers=s.layers,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(s.dim, s.classes)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids) + self.pos[:, :ids.shape[1]]
        mask = ids == 0 if self.padding else None
        h = self.encoder(x, src_key_padding_mask=mask) if self.batch_first else \
            self.encoder(x.transpose(0, 1), src_key_padding_mask=mask).transpose(0, 1)
        return self.head(h.mean(1))


class TiedLM(nn.Module):
    """A causal language model, tied input/output embeddings: ids ``(B, T)`` -> logits ``(B, T, vocab)`` = ``E h``."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.dim)
        self.pos = nn.Parameter(torch.zeros(s.length, s.dim))
        self.encoder = nn.TransformerEncoder(encoder_layer(s, True, norm_first=True), num_layers=s.layers,
                                             enable_nested_tensor=False)
        self.out = nn.Linear(s.dim, s.vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.out(self.encoder(self.embed(ids) + self.pos[:ids.shape[1]], mask=causal, is_causal=True))


class Decoder(nn.Module):
    """nn.TransformerDecoderLayer over target tokens with a memory from input features; ``inputs: (B, T, 1 +
    features)`` holds the target ids in channel 0; scores ``(B, classes)`` from the last position."""

    def __init__(self, s: Sizes, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(s.vocab, s.dim)
        self.memory = nn.Linear(s.features, s.dim)
        self.decoder = nn.TransformerDecoderLayer(s.dim, s.heads, dim_feedforward=s.ff, dropout=0.0,
                                                  batch_first=batch_first)
        self.head = nn.Linear(s.dim, s.classes)

    def forward(self, inputs: Tensor) -> Tensor:
        ids, feats = inputs[..., 0].long(), inputs[..., 1:]
        tgt, memory = self.embed(ids), self.memory(feats)
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        if not self.batch_first:
            tgt, memory = tgt.transpose(0, 1), memory.transpose(0, 1)
        h = self.decoder(tgt, memory, tgt_mask=causal)
        return self.head((h if self.batch_first else h.transpose(0, 1))[:, -1])


class ViT(nn.Module):
    """A ViT as in tutorials: patch Conv2d (patch 4), class token and positional table as bare parameters of the
    model, pre-norm nn.TransformerEncoder (GELU), head on the class token; images ``(B, 3, image, image)``."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, s.dim, 4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, s.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (s.image // 4) ** 2, s.dim))
        self.encoder = nn.TransformerEncoder(encoder_layer(s, True, norm_first=True, activation="gelu"),
                                             num_layers=s.layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(s.dim), nn.Linear(s.dim, s.classes)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(tokens))[:, 0])


def causal_encoder(s: Sizes, layers: int | None = None) -> nn.TransformerEncoder:
    return nn.TransformerEncoder(encoder_layer(s, True, norm_first=True), num_layers=layers or s.layers,
                                 enable_nested_tensor=False)


def causal_mask(t: int, device: torch.device) -> Tensor:
    return nn.Transformer.generate_square_subsequent_mask(t, device=device)


class GPT2(nn.Module):
    """GPT-2/BERT-style tied head written on the weight: ``wte``, ``wpe`` Embeddings (positions expanded per
    sample), pre-norm causal encoder, final LayerNorm, logits ``h @ wte.weight.T`` (``head="matmul"``) or
    ``F.linear(h, wte.weight) + bias`` with a bare output bias (``head="linear"``, BERT's decoder)."""

    def __init__(self, s: Sizes, head: str = "matmul") -> None:
        super().__init__()
        self.head = head
        self.wte, self.wpe = nn.Embedding(s.vocab, s.dim), nn.Embedding(s.length, s.dim)
        self.encoder, self.ln_f = causal_encoder(s), nn.LayerNorm(s.dim)
        self.bias = nn.Parameter(torch.zeros(s.vocab)) if head == "linear" else None

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        h = self.encoder(self.wte(ids) + self.wpe(positions), mask=causal_mask(ids.shape[1], ids.device),
                         is_causal=True)
        h = self.ln_f(h)
        return h @ self.wte.weight.T if self.head == "matmul" else F.linear(h, self.wte.weight) + self.bias


class NanoGPT(nn.Module):
    """nanoGPT as written: ``pos = torch.arange(T)``, ``x = wte(idx) + wpe(pos)`` (the positions' Embedding called
    WITHOUT the batch dimension, its ``(T, d)`` output broadcast over the batch), tied head through an nn.Linear
    (``wte.weight = lm_head.weight``)."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(s.vocab, s.dim), nn.Embedding(s.length, s.dim)
        self.encoder, self.ln_f = causal_encoder(s), nn.LayerNorm(s.dim)
        self.lm_head = nn.Linear(s.dim, s.vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, ids: Tensor) -> Tensor:
        pos = torch.arange(0, ids.shape[1], dtype=torch.long, device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        return self.lm_head(self.ln_f(self.encoder(x, mask=causal_mask(ids.shape[1], ids.device), is_causal=True)))


class ScaledBlock(nn.Module):
    """A pre-norm block with layer scale written as bare parameters: ``x + γ₁ ⊙ attn(LN x)``, ``x + γ₂ ⊙ mlp(LN x)``
    (CaiT / DINOv2 style, ``h * self.gamma``)."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(s.dim), nn.LayerNorm(s.dim)
        self.attn = nn.MultiheadAttention(s.dim, s.heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(s.dim, s.ff), nn.GELU(), nn.Linear(s.ff, s.dim))
        self.gamma1 = nn.Parameter(torch.full((s.dim,), 0.1))
        self.gamma2 = nn.Parameter(torch.full((s.dim,), 0.1))

    def forward(self, x: Tensor) -> Tensor:
        a = self.norm1(x)
        x = x + self.attn(a, a, a, need_weights=False)[0] * self.gamma1
        return x + self.gamma2 * self.mlp(self.norm2(x))


class LayerScaleEncoder(nn.Module):
    """Token ids -> embedding + bare positional table -> :class:`ScaledBlock` s -> mean -> linear head."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(s.vocab, s.dim), nn.Parameter(torch.zeros(1, s.length, s.dim))
        self.blocks = nn.Sequential(*(ScaledBlock(s) for _ in range(s.layers)))
        self.head = nn.Linear(s.dim, s.classes)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.blocks(self.embed(ids) + self.pos).mean(1))


class TiedAutoencoder(nn.Module):
    """A Linear's weight used again outside the Linear: ``h = relu(fc(x))``, ``x̂ = h @ fc.weight`` (tied decoder),
    head on the mean token."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.embed, self.fc, self.head = nn.Embedding(s.vocab, s.dim), nn.Linear(s.dim, s.ff), nn.Linear(s.dim,
                                                                                                        s.classes)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        return self.head((torch.relu(self.fc(x)) @ self.fc.weight + x).mean(1))


class PackedLM(nn.Module):
    """A causal LM whose tied head scores only the positions with a target (packed rows): ``inputs (B, 2, T)`` hold
    ids and targets (0: no target); the rows ``h[mask]`` go through ``F.linear(rows, wte.weight)`` inside
    :func:`~clbench.privacy.packing.rows_of` and the output is the per-sample loss ``(B,)`` (summed over its
    rows). ``dense=True``: the same loss from logits at every position (torch.func's reference can vmap it)."""

    def __init__(self, s: Sizes, dense: bool = False) -> None:
        super().__init__()
        self.dense = dense
        self.wte, self.pos = nn.Embedding(s.vocab, s.dim, padding_idx=0), nn.Parameter(torch.zeros(s.length, s.dim))
        self.encoder, self.ln_f = causal_encoder(s, 1), nn.LayerNorm(s.dim)

    def forward(self, inputs: Tensor) -> Tensor:
        ids, targets = inputs[:, 0], inputs[:, 1]
        h = self.ln_f(self.encoder(self.wte(ids) + self.pos, mask=causal_mask(ids.shape[1], ids.device),
                                   is_causal=True))
        if self.dense:
            ce = F.cross_entropy(F.linear(h, self.wte.weight).transpose(1, 2), targets, reduction="none")
            return (ce * (targets > 0)).sum(1)
        mask = targets > 0
        index = mask.nonzero()[:, 0]
        with rows_of(index):
            logits = F.linear(h[mask], self.wte.weight)
        ce = F.cross_entropy(logits, targets[mask], reduction="none")
        return ce.new_zeros(len(ids)).index_add(0, index, ce)


class EinsumHead(GPT2):
    """Built to slip past the rules: the tied head written with ``einsum`` (no rule follows it). The Embedding's
    hooks fire, every parameter receives a gradient, and the norms would be too small: the first-step invariant
    refuses it, naming ``einsum``."""

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        h = self.ln_f(self.encoder(self.wte(ids) + self.wpe(positions), mask=causal_mask(ids.shape[1], ids.device),
                                   is_causal=True))
        return torch.einsum("btd,vd->btv", h, self.wte.weight)


class DoubledLinear(nn.Module):
    """Built to slip past the rules: an nn.Linear whose forward (replaced on the instance) uses its weight twice
    inside the layer, where no watch looks; its rule sees one call and explains half the gradient."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.embed, self.fc, self.head = nn.Embedding(s.vocab, s.dim), nn.Linear(s.dim, s.dim), nn.Linear(s.dim,
                                                                                                         s.classes)
        fc = self.fc
        fc.forward = lambda x: F.linear(torch.tanh(F.linear(x, fc.weight)), fc.weight, fc.bias)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.fc(self.embed(ids)).mean(1))


def ids(s: Sizes, batch: int, seed: int = 1, padded: bool = False) -> Tensor:
    """Token ids ``(batch, length)`` in ``1 .. vocab - 1`` (``padded``: sample 0 ends with two padding ids 0)."""
    out = torch.randint(1, s.vocab, (batch, s.length), generator=torch.Generator().manual_seed(seed))
    if padded:
        out[0, -2:] = 0
    return out


def decoder_inputs(s: Sizes, batch: int) -> Tensor:
    g = torch.Generator().manual_seed(2)
    return torch.cat([torch.randint(0, s.vocab, (batch, s.length, 1), generator=g).to(torch.get_default_dtype()),
                      torch.randn(batch, s.length, s.features, generator=g)], -1)


def images(s: Sizes, batch: int) -> Tensor:
    return torch.randn(batch, 3, s.image, s.image, generator=torch.Generator().manual_seed(3))


def labels(s: Sizes, batch: int) -> Tensor:
    return torch.arange(batch) % s.classes


def packed_inputs(s: Sizes, batch: int) -> Tensor:
    """``(B, 2, T)``: ids with left padding, next-id targets where an id follows (0 elsewhere; sample 1 has none in
    its first half)."""
    x = ids(s, batch, seed=5)
    targets = torch.roll(x, -1, 1)
    targets[:, -1] = 0
    for i in range(batch):
        x[i, :i % s.length] = 0
        targets[i, :i % s.length] = 0
    targets[1, : s.length // 2] = 0
    return torch.stack([x, targets], 1)


def sample_losses(out: Tensor, y: Tensor) -> Tensor:
    """The models that return their own per-sample losses (PackedLM)."""
    return out


IDIOMS = {
    "gpt2_tied_head_matmul": (lambda s: GPT2(s, "matmul"), ids, lambda s, b: ids(s, b, seed=4)),
    "bert_tied_head_f_linear_bias": (lambda s: GPT2(s, "linear"), ids, lambda s, b: ids(s, b, seed=4)),
    "nanogpt_positions_unbatched": (NanoGPT, ids, lambda s, b: ids(s, b, seed=4)),
    "layer_scale_bare_parameters": (LayerScaleEncoder, ids, labels),
    "linear_weight_reused_outside": (TiedAutoencoder, ids, labels),
}
"""Idioms the rules follow exactly (name -> as :data:`ZOO`); the language models' targets are next ids ``(B, T)``."""

SLIPPING = {
    "einsum_tied_head": (EinsumHead, ids, lambda s, b: ids(s, b, seed=4), "einsum"),
    "linear_forward_replaced": (DoubledLinear, ids, labels, "a use inside a layer that its rule does not follow"),
}
"""Models built to slip past the rules (no structural check objects): name -> (model, inputs, targets, what the
first-step invariant's refusal names)."""

ZOO = {
    "encoder_batch_first": (lambda s: Encoder(s, True), ids, labels),
    "encoder_sequence_first": (lambda s: Encoder(s, False), ids, labels),
    "encoder_norm_first_padding_mask": (lambda s: Encoder(s, True, padding=True, norm_first=True),
                                        lambda s, b: ids(s, b, padded=True), labels),
    "tied_causal_lm": (TiedLM, ids, lambda s, b: ids(s, b, seed=4)),
    "decoder_batch_first": (lambda s: Decoder(s, True), decoder_inputs, labels),
    "decoder_sequence_first": (lambda s: Decoder(s, False), decoder_inputs, labels),
    "vit_cls_token_pos_table": (ViT, images, labels),
}
"""name -> ``(model(sizes), inputs(sizes, batch), targets(sizes, batch))``; the language model's targets are next
ids ``(B, T)``, the others' class labels ``(B,)``."""


# ------------------------------------------------------------------------------------------- the coverage zoo
class _Head(nn.Module):
    """``features (B, 8) -> body -> Linear(8, classes)``; ``body`` built by each idiom."""

    def __init__(self, body: nn.Module, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.body, self.head = body, nn.Linear(width, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.body(x)
        return self.head(h.flatten(1) if h.dim() > 2 else h)


class _Lambda(nn.Module):
    """A module whose forward is ``fn(self, x)`` and whose parameters are ``params`` (bare ``nn.Parameter`` s) and
    ``children``."""

    def __init__(self, fn, params: dict[str, Tensor] | None = None, **children: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        for name, value in (params or {}).items():
            setattr(self, name, nn.Parameter(value))
        for name, child in children.items():
            setattr(self, name, child)

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(self, x)


class _Square(torch.autograd.Function):
    """``x²`` as a custom autograd.Function without vmap support."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 2 * x * g


class _VmapSquare(torch.autograd.Function):
    """``x²`` as a custom autograd.Function that supports vmap (``setup_context``, ``generate_vmap_rule``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 2 * x * g


def _features(s: Sizes, b: int) -> Tensor:
    return torch.randn(b, 8, generator=torch.Generator().manual_seed(11))


def _maps(s: Sizes, b: int) -> Tensor:
    return torch.randn(b, 2, 4, 4, generator=torch.Generator().manual_seed(12))


def _series(s: Sizes, b: int) -> Tensor:
    return torch.randn(b, 4, 8, generator=torch.Generator().manual_seed(13))


def _volumes(s: Sizes, b: int) -> Tensor:
    return torch.randn(b, 2, 3, 3, 3, generator=torch.Generator().manual_seed(14))


def _tokens(s: Sizes, b: int) -> Tensor:
    return torch.randn(b, s.length, 8, generator=torch.Generator().manual_seed(15))


def _swiglu() -> nn.Module:
    return _Lambda(lambda m, x: m.down(F.silu(m.gate(x)) * m.up(x)), gate=nn.Linear(8, 12), up=nn.Linear(8, 12),
                   down=nn.Linear(12, 8))


def _shared_f_linear() -> nn.Module:
    block = _Lambda(lambda m, x: x[0] + torch.tanh(F.linear(x[0], x[1])))
    return _Lambda(lambda m, x: m.b2((m.b1((x, m.w)), m.w)), {"w": torch.randn(8, 8) * 0.3}, b1=block, b2=block)


def _mixing(fn) -> nn.Module:
    return _Lambda(lambda m, x: fn(m.fc(x)), fc=nn.Linear(8, 8))


def _frozen_tied() -> nn.Module:
    model = TiedLM(Sizes(vocab=11, length=6, dim=8, heads=2, ff=12, layers=1))
    model.embed.weight.requires_grad_(False)
    model.out = nn.Linear(8, 11)
    return model


def _sliced_positions(s: Sizes) -> nn.Module:
    return _Head(_Lambda(lambda m, x: (x + m.pos[:, :x.shape[1]]).mean(1), {"pos": torch.randn(1, 2 * s.length, 8)}))


def _hook_weight_norm() -> nn.Module:
    """The old hook-based ``torch.nn.utils.weight_norm``: a Linear whose ``weight_g`` and ``weight_v`` replace its
    weight, recomputed by a forward pre-hook (deprecated by torch, still common in audio models)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(nn.Linear(8, 8))


def _mha_kdim_vdim() -> nn.Module:
    attn = nn.MultiheadAttention(8, 2, kdim=5, vdim=3, batch_first=True)
    return _Lambda(lambda m, x: m.attn(x, x[..., :5], x[..., 5:], need_weights=False)[0].mean(1), attn=attn)


COVERAGE = {
    "swiglu_mlp": (lambda s: _Head(_swiglu()), _features, labels, False),
    "sliced_positional_table": (_sliced_positions, _tokens, labels, False),
    "mha_kdim_vdim": (lambda s: _Head(_mha_kdim_vdim()), _tokens, labels, False),
    "frozen_tied_weight_trainable_head": (lambda s: _frozen_tied(), ids, lambda s, b: ids(s, b, seed=4), False),
    "bare_parameter_f_linear_in_two_blocks": (lambda s: _Head(_shared_f_linear()), _features, labels, False),
    "bare_parameter_einsum": (lambda s: _Head(_Lambda(lambda m, x: torch.einsum("bd,ed->be", x, m.w),
                                                      {"w": torch.randn(8, 8) * 0.3})), _features, labels, False),
    "bare_parameter_gram_h_w_wt": (lambda s: _Head(_Lambda(lambda m, x: torch.tanh(x @ (m.w @ m.w.T)),
                                                           {"w": torch.randn(8, 8) * 0.3})), _features, labels, False),
    "weight_norm_parametrization": (lambda s: _Head(nn.utils.parametrizations.weight_norm(nn.Linear(8, 8))),
                                    _features, labels, False),
    "weight_norm_hook_based": (lambda s: _Head(_hook_weight_norm()), _features, labels, False),
    "rmsnorm": (lambda s: _Head(nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8))), _features, labels, False),
    "conv1d": (lambda s: _Head(nn.Conv1d(4, 2, 3, padding=1), 16), _series, labels, False),
    "bilinear": (lambda s: _Head(_Lambda(lambda m, x: m.bil(x, x), bil=nn.Bilinear(8, 8, 8))), _features, labels,
                 False),
    "custom_function_without_vmap": (lambda s: _Head(_Lambda(lambda m, x: _Square.apply(x @ m.w),
                                                             {"w": torch.randn(8, 8) * 0.3})), _features, labels,
                                     False),
    "custom_function_with_vmap_rule": (lambda s: _Head(_Lambda(lambda m, x: _VmapSquare.apply(x * m.g),
                                                               {"g": torch.randn(8)})), _features, labels, False),
    "batch_centering_z_minus_mean": (lambda s: _Head(_mixing(lambda z: z - z.mean(0))), _features, labels, True),
    "functional_batch_norm_training": (lambda s: _Head(_mixing(lambda z: F.batch_norm(z, None, None, training=True))),
                                       _features, labels, True),
    "batchnorm1d_module": (lambda s: _Head(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))), _features, labels,
                           True),
    "conv2d_grouped": (lambda s: _Head(nn.Conv2d(2, 4, 3, padding=1, groups=2), 64), _maps, labels, False),
    "conv3d": (lambda s: _Head(nn.Conv3d(2, 1, 2), 8), _volumes, labels, False),
    "groupnorm": (lambda s: _Head(nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4)), 64), _maps,
                  labels, False),
    "instancenorm2d_affine": (lambda s: _Head(nn.Sequential(nn.Conv2d(2, 4, 3, padding=1),
                                                            nn.InstanceNorm2d(4, affine=True)), 64), _maps, labels,
                              False),
    "layernorm_embedding": (lambda s: Encoder(s, True), ids, labels, False),
    "embedding_bag": (lambda s: _Head(_Lambda(lambda m, x: m.bag(x), bag=nn.EmbeddingBag(s.vocab, 8))), ids, labels,
                      False),
    "gru": (lambda s: _Head(_Lambda(lambda m, x: m.rnn(x)[0][:, -1], rnn=nn.GRU(8, 8, batch_first=True))), _tokens,
            labels, False),
    "prelu": (lambda s: _Head(nn.Sequential(nn.Linear(8, 8), nn.PReLU())), _features, labels, False),
    "gpt2_tied_head_matmul": (lambda s: GPT2(s, "matmul"), ids, lambda s, b: ids(s, b, seed=4), False),
    "nanogpt_positions_unbatched": (NanoGPT, ids, lambda s, b: ids(s, b, seed=4), False),
    "vit_cls_token_pos_table": (ViT, images, labels, False),
    "layer_scale_bare_parameters": (LayerScaleEncoder, ids, labels, False),
}
"""Idioms for the coverage table of docs/privacy.md (tests/test_privacy.py): name -> ``(model(sizes),
inputs(sizes, batch), targets(sizes, batch), mixes)``; ``mixes``: the model mixes the samples of a batch (no
per-sample gradient exists: refusing is the only right answer)."""
