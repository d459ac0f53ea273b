"""A SASRec-style next-item transformer (Kang & McAuley, 2018) with SHARED item embeddings, as used by Ding et al.
(ICML 2024) for private sequential recommendation.

``items (B, L)`` (ids ``1..V``, 0 = padding) ->
``h_0 = E[items] + P[0..L-1]`` (learned positions) -> ``depth`` blocks with causal attention (:data:`BLOCKS`):

- ``norm="pre"`` (SASRec's, the default): ``h ← h + Attn(LN_1 h)``, ``h ← h + W_2 act(W_1 LN_2 h)``, then a final
  ``LN`` after the last block;
- ``norm="post"`` (Vaswani et al., 2017, the encoder of Ding et al., Appendix D.2): ``h ← LN_1(h + Attn(h))``,
  ``h ← LN_2(h + W_2 act(W_1 h))``, no final ``LN`` (the last block's output is normalized already);

-> scores ``h · Oᵀ`` ``(B, L, V + 1)`` from the output layer ``output = nn.Linear(d, V+1, bias=False)``:

- ``embeddings="tied"`` (the default; Ding et al.'s parameter sharing): ``O`` IS the input embedding's Parameter
  ``item_emb.weight = E`` (PyTorch's weight-tying idiom: one Parameter, used by an ``nn.Embedding`` and an
  ``nn.Linear``; per-sample gradient code finds the tie by parameter identity);
- ``embeddings="untied"`` (their "w/o parameter sharing", Appendix D.5): ``O`` is a Parameter of its own, initialized
  like ``E`` (``N(0, 0.02²)``, padding row 0 zero; the padding row's score is never trained nor read). Ding et al.'s
  third setting, untied at half the embedding dimension, is ``dim = d/2`` with ``embeddings="untied"``.

The position ``t`` output depends only on items ``0..t``. Training objective (:func:`next_item_loss`): softmax
cross-entropy over all ``V`` items (padding excluded) at every position that has a target. Training computes the
output layer at those positions only (``forward(items, targets=...)`` -> :class:`TargetScores`, loss
:func:`target_loss`, the same loss): the ``N`` rows of ``h`` that have a target are gathered and scored against the tied
matrix's item rows ``O[1:]`` (``F.linear``: no padding column to slice off and back in the backward) with each row's
sample index (packed rows, :func:`clbench.privacy.packing.rows_of`), so private training clips each sample's
gradient from its own rows; the blocks' feed-forward halves run on the item tokens only, likewise packed. With
most positions padding (Amazon Games: 1,616 targets in a batch of 256 windows of 50) the ``N·V`` scores replace
``B·L·V``.

Attention is :class:`~clbench.privacy.reattention.CausalSelfAttention` (``attention="vanilla"``) or
:class:`~clbench.privacy.reattention.ReAttention`; with an :class:`~clbench.privacy.reattention.ErrorPrior` set
(:meth:`SeqRec.set_error_prior`), the forward pass also tracks the activations' variances and Re-Attention uses
them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from clbench.privacy.packing import rows_of
from clbench.privacy.reattention import (
    ACTIVATIONS,
    ATTENTIONS,
    ErrorPrior,
    activation_var,
    layer_norm_var,
    linear_var,
)
from clbench.protocol import NEXT_ITEM, ScenarioInfo
from clbench.registry import MODELS


class Block(nn.Module):
    """One transformer block's layers (``LN_1``, causal attention, ``LN_2``, the feed-forward ``W_2 act(W_1 ·)``,
    dropout after attention and each FFN layer); :class:`PreNormBlock` and :class:`PostNormBlock` place the norms.

    ``forward(h, pad, var, param_var, track, packed)``: ``h (B, L, d)``, ``pad (B, L)``, ``var``: variances of ``h``
    (None: no error tracking); ``track=False``: ``var`` serves this block's attention scores only and no output
    variance is returned (last block); ``packed``: the feed-forward half runs on the rows of the item tokens only
    (when no variance is tracked through it; padding left as it is: a padding position is a masked key of every query
    and its own output is never scored, so the scored outputs are the same), as packed rows with their samples
    (:func:`clbench.privacy.packing.rows_of`). Returns ``(h, var)``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float, activation: str,
                 attention: str) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = ATTENTIONS[attention](dim, heads, dropout)
        hidden = int(dim * mlp_ratio)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)

    final_norm: Callable[[int], nn.Module]
    """The module after the last block: ``nn.LayerNorm(d)`` (pre-LN) or ``nn.Identity`` (post-LN)."""

    def ffn(self, f: Tensor, var: Tensor | None, param_var: float) -> tuple[Tensor, Tensor | None]:
        """``(W_2 act(W_1 f), its variance given Var f = var)`` (undropped output; variance None without ``var``)."""
        z = self.fc1(f)
        y = self.fc2(self.dropout(ACTIVATIONS[self.activation](z)))
        if var is None:
            return y, None
        with torch.no_grad():
            z_var = activation_var(self.activation, z, linear_var(f, var, self.fc1, param_var))
            return y, linear_var(ACTIVATIONS[self.activation](z), z_var, self.fc2, param_var)


class PreNormBlock(Block):
    """``h ← h + Attn(LN_1 h)``; ``h ← h + W_2 act(W_1 LN_2 h)`` (SASRec's)."""

    final_norm = nn.LayerNorm

    def forward(self, h: Tensor, pad: Tensor, var: Tensor | None, param_var: float,
                track: bool = True, packed: bool = False) -> tuple[Tensor, Tensor | None]:
        a = self.norm1(h)
        a_var = None if var is None else _no_grad(layer_norm_var, h, var, self.norm1, param_var)
        out, out_var = self.attn(a, pad, a_var, param_var, track)
        var = var if track else None
        h = h + self.dropout(out)
        if packed and var is None:
            items = ~pad
            with rows_of(items.nonzero()[:, 0]):
                rows = h[items]
                y, _ = self.ffn(self.norm2(rows), None, param_var)
            return h.index_put((items,), rows + self.dropout(y)), var
        if var is not None:
            var = var + out_var
        f = self.norm2(h)
        y, y_var = self.ffn(f, None if var is None else _no_grad(layer_norm_var, h, var, self.norm2, param_var),
                            param_var)
        return h + self.dropout(y), None if var is None else var + y_var


class PostNormBlock(Block):
    """``h ← LN_1(h + Attn(h))``; ``h ← LN_2(h + W_2 act(W_1 h))`` (Vaswani et al.'s encoder block)."""

    final_norm = nn.Identity

    def forward(self, h: Tensor, pad: Tensor, var: Tensor | None, param_var: float,
                track: bool = True, packed: bool = False) -> tuple[Tensor, Tensor | None]:
        out, out_var = self.attn(h, pad, var, param_var, track)
        s = h + self.dropout(out)
        var = None if var is None or not track else _no_grad(layer_norm_var, s, var + out_var, self.norm1, param_var)
        h = self.norm1(s)
        if packed and var is None:
            items = ~pad
            with rows_of(items.nonzero()[:, 0]):
                rows = h[items]
                y, _ = self.ffn(rows, None, param_var)
                rows = self.norm2(rows + self.dropout(y))
            return h.index_put((items,), rows), var
        y, y_var = self.ffn(h, var, param_var)
        s = h + self.dropout(y)
        return self.norm2(s), None if var is None else _no_grad(layer_norm_var, s, var + y_var, self.norm2, param_var)


BLOCKS: dict[str, type[Block]] = {"pre": PreNormBlock, "post": PostNormBlock}
"""Where the block's LayerNorms sit (``norm``): pre-LN (SASRec) or post-LN (Vaswani et al.)."""


def _tie(model: SeqRec) -> None:
    model.output.weight = model.item_emb.weight                      # the tie: one Parameter, two uses


def _untie(model: SeqRec) -> None:
    nn.init.normal_(model.output.weight, std=0.02)
    with torch.no_grad():
        model.output.weight[0].zero_()


EMBEDDINGS: dict[str, Callable[[SeqRec], None]] = {"tied": _tie, "untied": _untie}
"""The output layer ``O`` against the input embedding ``E`` (``embeddings``): one Parameter, or two."""


def _no_grad(fn, *args):
    with torch.no_grad():
        return fn(*args)


class SeqRec(nn.Module):
    """See the module docstring. ``n_items = V`` (scores have ``V + 1`` columns, column 0 = padding)."""

    def __init__(self, n_items: int, max_len: int, dim: int = 64, depth: int = 2, heads: int = 1,
                 mlp_ratio: float = 4.0, dropout: float = 0.2, activation: str = "relu",
                 attention: str = "vanilla", norm: str = "pre", embeddings: str = "tied") -> None:
        super().__init__()
        for name, value, table in (("attention", attention, ATTENTIONS), ("activation", activation, ACTIVATIONS),
                                   ("norm", norm, BLOCKS), ("embeddings", embeddings, EMBEDDINGS)):
            if value not in table:
                raise ValueError(f"{name} must be one of {sorted(table)}; got {value!r}.")
        self.n_items, self.max_len = n_items, max_len
        self.item_emb = nn.Embedding(n_items + 1, dim, padding_idx=0)
        self.pos_emb = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(BLOCKS[norm](dim, heads, mlp_ratio, dropout, activation, attention)
                                    for _ in range(depth))
        self.norm = BLOCKS[norm].final_norm(dim)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(dim, n_items + 1, bias=False)
        nn.init.normal_(self.item_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
        EMBEDDINGS[embeddings](self)
        self.error_prior: ErrorPrior | Callable[[], ErrorPrior | None] | None = None

    def set_error_prior(self, prior: ErrorPrior | Callable[[], ErrorPrior | None] | None) -> None:
        """Track activation variances from ``prior`` in every forward pass (None: no tracking); a callable is
        asked for the prior at each forward pass (σ_dp may be calibrated only once training starts)."""
        self.error_prior = prior

    def hidden(self, items: Tensor, packed: bool = False) -> Tensor:
        """``(B, L)`` item ids -> ``(B, L, d)`` final hidden states (``packed``: the blocks' feed-forward halves on
        the item tokens only, :class:`Block`; the padding positions' states differ, the items' do not)."""
        if items.shape[1] > self.max_len:
            raise ValueError(f"sequences of length {items.shape[1]} exceed max_len {self.max_len}.")
        pad = items == 0
        positions = torch.arange(items.shape[1], device=items.device).expand_as(items)     # (B, L): per sample
        h = self.dropout(self.item_emb(items) + self.pos_emb(positions))
        var, param_var = None, 0.0
        prior = self.error_prior() if callable(self.error_prior) else self.error_prior
        if prior is not None and prior.active:
            param_var = prior.dense_var
            token_var = prior.token_var().to(h.device, h.dtype)
            token_var[0] = 0.0                                          # the padding row is fixed at 0
            var = (token_var[items] + param_var)[..., None].expand_as(h).clone()
        for i, block in enumerate(self.blocks):
            h, var = block(h, pad, var, param_var, track=i < len(self.blocks) - 1, packed=packed)
        return self.norm(h)

    def forward(self, items: Tensor, last: int | None = None, targets: Tensor | None = None) -> Tensor | TargetScores:
        """``(B, L)`` -> scores ``(B, L, V + 1)`` of every item at every position, or ``(B, last, V + 1)`` at the
        last ``last`` positions only; with ``targets (B, L)`` (0: no target), the scores at the ``N`` positions that
        have a target only (:class:`TargetScores`, items ``1..V``: the output layer, ``L·V`` scores a sample,
        dominates the cost at a large vocabulary)."""
        h = self.hidden(items, packed=targets is not None)
        if targets is not None:
            mask = targets > 0
            with rows_of(mask.nonzero()[:, 0]):                      # each row's sample, for private training
                scores = F.linear(h[mask], self.output.weight[1:])   # items 1..V (O without its padding row)
            return TargetScores(scores, mask, targets[mask])
        return self.output(h if last is None else h[:, -last:])

    def last_scores(self, items: Tensor) -> Tensor:
        """Scores ``(B, V)`` of items ``1..V`` for the item after the last position."""
        return self.output(self.hidden(items)[:, -1])[:, 1:]


class TargetScores(NamedTuple):
    """Scores at the positions that have a target: ``scores (N, V)`` of items ``1..V`` at the ``N`` positions where
    ``mask (B, L)`` is True (row-major order), their targets ``labels (N,)`` (ids ``1..V``)."""

    scores: Tensor
    mask: Tensor
    labels: Tensor


def target_loss(out: TargetScores, reduction: str = "mean") -> Tensor:
    """:func:`next_item_loss` from the scores at the target positions only: the same per-position cross-entropies
    placed at their positions of a ``(B, L)`` table (zeros elsewhere) and summed per sample, so the loss equals the
    every-position loss (same values, same summation)."""
    ce = F.cross_entropy(out.scores, out.labels - 1, reduction="none")
    return _reduce(ce.new_zeros(out.mask.shape).masked_scatter_(out.mask, ce).sum(1), reduction)


def _reduce(losses: Tensor, reduction: str) -> Tensor:
    reduce = {"sample": lambda x: x, "sum": torch.sum, "mean": torch.mean}
    if reduction not in reduce:
        raise ValueError(f"reduction must be mean, sum or sample, got {reduction!r}.")
    return reduce[reduction](losses)


def next_item_loss(scores: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Per-sample losses ``L_i = Σ_t CE(scores_{i,t}, targets_{i,t})``: softmax cross-entropy over items ``1..V``
    summed over the positions with a target (``targets > 0``). ``scores (B, L, V + 1)``, ``targets (B, L)``.
    ``mean``: ``(1/B) Σ_i L_i`` (the batch mean of per-sample losses that private training requires); ``sum``;
    ``sample``: the ``(B,)`` losses ``L_i``."""
    losses = F.cross_entropy(scores[..., 1:].flatten(0, 1), (targets - 1).flatten(), ignore_index=-1,
                             reduction="none").view(targets.shape).sum(1)
    return _reduce(losses, reduction)


@MODELS.register("seqrec")
def seqrec(info: ScenarioInfo, **kwargs) -> SeqRec:
    """:class:`SeqRec` for a recommendation scenario (``info.extra['n_items']``, ``info.input_shape = (L,)``)."""
    return SeqRec(info.extra["n_items"], info.input_shape[0], **kwargs)


seqrec.kind = NEXT_ITEM       # the kind of scenario it is built for (clbench.protocol.scenario_kind)
