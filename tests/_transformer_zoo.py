"""Transformers written the usual PyTorch way (nn.TransformerEncoderLayer / nn.TransformerDecoderLayer, bare
nn.Parameters for positional tables and class tokens, tied input/output embeddings), for private training: the zoo
that tests/test_privacy_zoo.py checks against vmap's per-sample gradients and benchmarks/dp_cost.py times
(a test helper: the benchmark puts the repository first on its path to import it).

Every model maps a batch (sample dimension first) to scores; sizes are arguments (``Sizes``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


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
