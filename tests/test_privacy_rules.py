"""Per-sample gradient norms without per-sample gradients (clbench.privacy) against torch.func's vmap(grad)
per-sample gradients, in float64, for every supported layer and for whole models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.layers import LayerScale
from torch import nn
from torch.func import functional_call, grad, vmap

from clbench.models.vit import vit
from clbench.privacy import UnsupportedLayerError, per_sample_grad_norms
from clbench.privacy.rules import Outer
from clbench.protocol import ClassificationInfo
from clbench.tangent import linearize

RTOL = 1e-6


@pytest.fixture(autouse=True)
def _float64():
    """Every model and tensor of these tests in float64 (the default dtype is restored afterwards)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def ce(logits, y):
    """Per-sample cross-entropy; sequence logits (B, T, V) with targets (B, T) are summed over positions."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").sum(1)
    return F.cross_entropy(logits, y, reduction="none")


def vmap_norms(model, loss_fn, x, y):
    """The reference: per-sample gradients from torch.func (vmap over grad), then their L2 norms."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    frozen.update(dict(model.named_buffers()))

    def loss_one(params, xi, yi):
        out = functional_call(model, (params, frozen), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0)).sum()

    grads = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    return torch.stack([g.flatten(1).square().sum(1) for g in grads.values()]).sum(0).sqrt()


def loop_norms(model, loss_fn, x, y):
    """A second reference for modules torch.func cannot vmap (custom autograd Functions): one backward per sample."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in range(len(x)):
        gs = torch.autograd.grad(loss_fn(model(x[i:i + 1]), y[i:i + 1]).sum(), params, allow_unused=True)
        norms.append(sum(g.square().sum() for g in gs if g is not None).sqrt())
    return torch.stack(norms)


def check(model, x, y, loss_fn=ce, reference=vmap_norms):
    ours = per_sample_grad_norms(model, loss_fn, x, y)
    ref = reference(model, loss_fn, x, y)
    assert ours.shape == (len(x),)
    assert torch.all(ref > 0)
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=0)


class Seq(nn.Module):
    """Applies ``layer`` to a sequence (B, T, d) then a linear head on the mean token."""

    def __init__(self, layer, d, classes=3):
        super().__init__()
        self.layer, self.head = layer, nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.layer(x).mean(1))


def seq_data(b=5, t=7, d=6, classes=3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(b, t, d, generator=g), torch.randint(0, classes, (b,), generator=g)


def test_linear_on_vectors():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3, bias=False))
    check(model, torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g))


@pytest.mark.parametrize("t", [2, 20], ids=["gram", "per-sample-matrix"])
def test_linear_on_sequences_both_branches(t):
    x, y = seq_data(t=t)
    layer = nn.Linear(6, 5)
    assert Outer(x, torch.zeros(5, t, 5)).formed == (t == 20)          # d·p = 30 ≤ T(d + p) = 11 T
    check(Seq(layer, 5), x, y)


@pytest.mark.parametrize(("t", "d", "p", "groups", "formed"), [
    (1, 6, 5, 1, False), (2, 6, 5, 1, False), (20, 6, 5, 1, True), (4, 36, 8, 2, False), (9, 18, 3, 2, True)],
    ids=["vectors", "gram", "matrices", "grouped_gram", "grouped_matrices"])
def test_outer_forms_give_the_per_sample_matrices_norms_and_weighted_sum(t, d, p, groups, formed):
    """Each form of Outer (T = 1, Gram, per-sample matrices kept for the weighted sum; one or two blocks per sample)
    against the per-sample matrices G_iᵀA_i formed explicitly, with unequal weights."""
    g = torch.Generator().manual_seed(4)
    batch = 5
    a, grad = torch.randn(batch * groups, t, d, generator=g), torch.randn(batch * groups, t, p, generator=g)
    w = torch.rand(batch, generator=g)
    outer = Outer(a, grad, groups)
    assert outer.formed == formed
    blocks = torch.einsum("ntp,ntd->npd", grad, a).view(batch, groups, p, d)
    torch.testing.assert_close(outer.sq_norms(), blocks.square().sum((1, 2, 3)), rtol=RTOL, atol=0)
    torch.testing.assert_close(outer.weighted(w), torch.einsum("b,bjpd->jpd", w, blocks).reshape(groups * p, d),
                               rtol=RTOL, atol=1e-12)


def test_linear_called_twice_includes_the_cross_term():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.shared, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

        def forward(self, x):
            return self.head(self.shared(torch.tanh(self.shared(x))).mean(1))

    check(Twice(), *seq_data())


def test_conv2d_patch_embedding_and_overlapping_conv():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
    patch = nn.Sequential(nn.Conv2d(3, 5, 4, stride=4), nn.Flatten(), nn.Linear(20, 3))
    check(patch, x, y)
    overlapping = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    check(overlapping, x, y)


@pytest.mark.parametrize("conv", [
    lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2), lambda: nn.Conv2d(4, 4, 3, groups=4, dilation=2),
    lambda: nn.Conv2d(4, 6, (3, 2), padding="same", padding_mode="reflect"),
    lambda: nn.Conv2d(4, 6, 3, padding=2, padding_mode="circular", bias=False),
    lambda: nn.Conv2d(4, 16, 5, stride=2, groups=2)],
    ids=["grouped", "depthwise_dilated", "same_reflect", "circular_no_bias", "grouped_gram"])
def test_conv2d_groups_dilation_and_padding_modes(conv):
    """Grouped and depthwise convolutions (the rows of each channel group), dilation, padding given as 'same' and
    every padding mode, followed by a GroupNorm on the (B, C, H, W) output."""
    g = torch.Generator().manual_seed(2)
    model = nn.Sequential(conv(), nn.GroupNorm(2, conv().out_channels), nn.Flatten(1), nn.LazyLinear(3))
    x, y = torch.randn(4, 4, 7, 7, generator=g), torch.randint(0, 3, (4,), generator=g)
    model(x)
    check(model, x, y)


@pytest.mark.parametrize("conv", [lambda: nn.Conv1d(4, 6, 3, padding=1, stride=2), lambda: nn.Conv1d(4, 6, 5, groups=2,
                                                                                              padding="same")],
                         ids=["strided", "grouped_same"])
def test_conv1d(conv):
    g = torch.Generator().manual_seed(3)
    model = nn.Sequential(conv(), nn.ReLU(), nn.Flatten(1), nn.LazyLinear(3))
    x, y = torch.randn(4, 4, 9, generator=g), torch.randint(0, 3, (4,), generator=g)
    model(x)
    check(model, x, y)


def test_layernorm_and_layerscale():
    check(Seq(nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), LayerScale(6, init_values=0.5)), 6), *seq_data())


def test_embedding_with_repeated_ids_and_padding():
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 4, padding_idx=0), nn.Linear(4, 3)

        def forward(self, ids):
            return self.head(torch.tanh(self.emb(ids)).sum(1))

    ids = torch.tensor([[1, 2, 2, 0, 5], [3, 3, 3, 3, 0], [9, 8, 7, 6, 5]])
    check(Bag(), ids, torch.tensor([0, 1, 2]))


class TinySeqRec(nn.Module):
    """A one-block next-item model with SHARED input/output item embeddings (PyTorch's tying idiom, as the #13
    seqrec model): ``output.weight is items.weight``; positions are an Embedding of expanded position ids."""

    def __init__(self, items=30, d=8, length=6):
        super().__init__()
        self.items = nn.Embedding(items, d, padding_idx=0)
        self.positions = nn.Embedding(length, d)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.output = nn.Linear(d, items, bias=False)
        self.output.weight = self.items.weight
        for p in (self.items.weight, self.positions.weight):
            nn.init.normal_(p, std=0.5)

    def forward(self, ids, expand=True):
        positions = torch.arange(ids.shape[1])
        h = self.items(ids) + self.positions(positions.expand_as(ids) if expand else positions)
        h = h + self.mlp(self.norm(h))
        return self.output(h)                           # (B, T, V)


def tied_data(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 30, (5, 6), generator=g)
    ids[:, 0] = ids[:, 3]                              # repeated items: the input side's same-id terms
    targets = torch.randint(1, 30, (5, 6), generator=g)
    targets[:, 1] = ids[:, 2]                          # targets that are also inputs: the cross term
    return ids, targets


def test_tied_embedding_phantom_clipping_matches_vmap():
    model = TinySeqRec()
    assert model.output.weight is model.items.weight
    check(model, *tied_data(2))


def test_tied_embedding_cross_term_is_needed(monkeypatch):
    """Without the cross term between the two uses of E the norm is different (wrong)."""
    model, (ids, targets) = TinySeqRec(), tied_data(3)
    ref = vmap_norms(model, ce, ids, targets)
    torch.testing.assert_close(per_sample_grad_norms(model, ce, ids, targets), ref, rtol=RTOL, atol=0)
    monkeypatch.setattr("clbench.privacy.tape.cross_sq_norms", lambda *a: torch.zeros(len(ids)))
    assert not torch.allclose(per_sample_grad_norms(model, ce, ids, targets), ref, rtol=1e-3)


def test_position_ids_without_batch_dimension_broadcast_over_the_batch():
    """nanoGPT's positions: the Embedding called on ``arange(T)`` (no sample dimension), its ``(T, d)`` output
    added to every sample's tokens; each sample's share of the table's gradient is its own."""
    model, (ids, targets) = TinySeqRec(), tied_data(4)
    check(_NoExpand(model), ids, targets)


def test_an_output_without_batch_dimension_used_otherwise_is_refused():
    """The same positions also used once more, not broadcast over the batch: its gradient cannot be split by sample."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = TinySeqRec()

        def forward(self, ids):
            m = self.model
            table = m.positions(torch.arange(ids.shape[1]))
            h = m.items(ids) + table
            return m.output(h + m.mlp(m.norm(h)) + table.mean(0).tanh())

    with pytest.raises(UnsupportedLayerError, match="computed without the sample dimension, is used other than by "
                                                    "adding it to activations of every sample"):
        per_sample_grad_norms(Twice(), ce, *tied_data(4))


class _NoExpand(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids, expand=False)


def small_vit(**kw):
    info = ClassificationInfo(name="t", n_classes=4, classes_per_experience=(4,), input_shape=(3, 8, 8))
    torch.manual_seed(0)
    return vit(info, embed_dim=16, depth=2, num_heads=2, patch_size=4, fused_attn=False, **kw)


def image_data(b=4):
    g = torch.Generator().manual_seed(4)
    return torch.randn(b, 3, 8, 8, generator=g), torch.randint(0, 4, (b,), generator=g)


def test_whole_vit_with_cls_token_and_pos_embed():
    model = small_vit(init_values=0.1)                    # LayerScale too
    with torch.no_grad():
        model.cls_token.normal_()
        model.pos_embed.normal_()
    names = {n for n, p in model.named_parameters()}
    assert {"cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.ls1.gamma"} <= names
    check(model, *image_data())


def test_linearized_vit_with_tangent_cls_token():
    tangent = linearize(small_vit(), last_blocks=1, linearize_cls=True).randomize_deltas(0.05, seed=1)
    assert "cls_token" in dict(tangent.named_parameters())
    check(tangent, *image_data(), reference=loop_norms)


def test_linearized_vit_tangent_layers():
    """The tangent layers' Δ (TangentLinear, TangentLayerNorm, TangentLayerScale, the head) without a tangent CLS
    token. torch.func cannot vmap the tangent LayerNorm's custom autograd Function, so the reference is one backward
    per sample."""
    tangent = linearize(small_vit(init_values=0.1), last_blocks=2).randomize_deltas(0.05, seed=2)
    check(tangent, *image_data(), reference=loop_norms)


def test_loop_reference_agrees_with_vmap():
    """The per-sample-loop reference used for the tangent models is itself exact (same numbers as vmap)."""
    model, (x, y) = small_vit(), image_data()
    torch.testing.assert_close(loop_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=1e-10, atol=0)


def test_frozen_parameters_are_left_out():
    model = small_vit()
    for p in model.blocks[0].parameters():
        p.requires_grad_(False)
    check(model, *image_data())


@pytest.mark.parametrize("layer", [lambda: nn.GroupNorm(2, 6), lambda: nn.RMSNorm(6), nn.PReLU,
                                   lambda: nn.BatchNorm1d(6).eval()],
                         ids=["groupnorm", "rmsnorm", "prelu_fallback", "batchnorm_eval_fallback"])
def test_norm_layers_and_layers_without_a_rule(layer):
    """GroupNorm and RMSNorm by their ghost rules; PReLU and an evaluating BatchNorm (no rule: replayed per sample by
    clbench.privacy.fallback)."""
    model = nn.Sequential(nn.Linear(6, 6), layer(), nn.Linear(6, 3))
    g = torch.Generator().manual_seed(5)
    check(model, torch.randn(4, 6, generator=g), torch.tensor([0, 1, 2, 0]))


def test_parameter_shared_by_two_linear_layers_is_clipped_as_one():
    """Two nn.Linear sharing one weight: both uses' Gram cross term (clbench.privacy.tied)."""
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.Linear(6, 3))
    model[2].weight = model[0].weight
    g = torch.Generator().manual_seed(5)
    check(model, torch.randn(4, 6, generator=g), torch.tensor([0, 1, 2, 0]))


def test_parameter_shared_by_a_linear_and_a_layer_norm_is_refused():
    model = nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 3))
    model[1].bias = model[0].bias
    with pytest.raises(UnsupportedLayerError, match=r"shared by 0.bias \(Linear\), 1.bias \(LayerNorm\)"):
        per_sample_grad_norms(model, ce, torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))


def test_a_weight_used_outside_its_layer_in_f_linear_is_followed():
    class Bypass(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def forward(self, x):
            return F.linear(x, self.lin.weight)          # bypasses the module's forward

    g = torch.Generator().manual_seed(6)
    check(Bypass(), torch.randn(4, 6, generator=g), torch.tensor([0, 1, 2, 0]))


def test_a_block_of_a_weights_rows_used_outside_its_layer_is_clipped_with_the_layer():
    """``F.linear(z, fc.weight[2:])`` beside ``fc`` itself (and the rows of an Embedding's table scored the same
    way): the product covers rows 2.. of the weight only; cross terms over the shared rows."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc, self.head = nn.Embedding(7, 6), nn.Linear(6, 6), nn.Linear(4, 3)

        def forward(self, ids):
            h = self.fc(self.emb(ids))
            return self.head((F.linear(torch.tanh(h), self.fc.weight[2:]) + F.linear(h, self.emb.weight[3:])).mean(1))

    g = torch.Generator().manual_seed(7)
    check(Block(), torch.randint(0, 7, (4, 5), generator=g), torch.tensor([0, 1, 2, 0]))


def test_gradient_unseen_by_hooks_is_refused():
    class Sneaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def forward(self, x):
            return x @ self.lin.weight.T.contiguous()      # a copy of the weight: no layer and no product sees it

    with pytest.raises(UnsupportedLayerError, match="no hook saw"):
        per_sample_grad_norms(Sneaky(), ce, torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))


def test_flattened_batch_is_refused():
    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def forward(self, x):
            return self.lin(x.reshape(-1, 6)).view(x.shape[0], -1, 3).mean(1)

    with pytest.raises(UnsupportedLayerError, match="leading dimension 35"):
        per_sample_grad_norms(Flat(), ce, *seq_data())


def test_loss_must_be_per_sample():
    with pytest.raises(ValueError, match="one loss per sample"):
        per_sample_grad_norms(nn.Linear(6, 3), lambda out, y: F.cross_entropy(out, y), torch.randn(4, 6),
                              torch.tensor([0, 1, 2, 0]))
