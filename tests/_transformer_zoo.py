"""Transformers written the usual PyTorch way (nn.TransformerEncoderLayer / nn.TransformerDecoderLayer, bare
nn.Parameters for positional tables and class tokens, tied input/output embeddings), for private training: the zoo
that tests/test_privacy_zoo.py checks against vmap's per-sample gradients and benchmarks/dp_cost.py times
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
