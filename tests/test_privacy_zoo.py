"""Private training of transformers written the usual PyTorch way: per-sample gradient norms (clbench.privacy) of
models built from nn.TransformerEncoderLayer / nn.TransformerDecoderLayer / nn.MultiheadAttention and bare
nn.Parameters (positional tables, class tokens) against torch.func's vmap(grad) per-sample gradients in float64;
the traced attention forward against torch's (outputs, weights, state dicts); one full private step through the dp
callback against a naive per-sample clip-and-sum; the refusals of bare parameters used otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clbench.privacy import UnsupportedLayerError, per_sample_grad_norms
from clbench.privacy.tape import Tape
from tests.test_privacy_dp import per_sample_grads, private_callback
from tests.test_privacy_norms import RTOL, ce, vmap_norms

pytestmark = pytest.mark.usefixtures("float64")

V, T, D, HEADS = 11, 6, 8, 2


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (torch leaves some biases and tables at zero) so every one reaches the loss."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.train()


def _layer(batch_first: bool, **kw) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=12, dropout=0.0, batch_first=batch_first, **kw)


class Encoder(nn.Module):
    """Token ids ``(B, T)`` -> embedding + positional table (a bare parameter) -> nn.TransformerEncoder -> mean ->
    linear head. ``batch_first=False``: the encoder runs on ``(T, B, D)`` (transposed in and out)."""

    def __init__(self, batch_first: bool, padding: bool = False, **kw) -> None:
        super().__init__()
        self.batch_first, self.padding = batch_first, padding
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(1, T, D))
        self.encoder = nn.TransformerEncoder(_layer(batch_first, **kw), num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(D, 3)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[:, :ids.shape[1]]
        mask = ids == 0 if self.padding else None
        h = self.encoder(x, src_key_padding_mask=mask) if self.batch_first else \
            self.encoder(x.transpose(0, 1), src_key_padding_mask=mask).transpose(0, 1)
        return self.head(h.mean(1))


class TiedLM(nn.Module):
    """A causal language model with tied input/output embeddings: logits ``(B, T, V)`` = ``E h``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(T, D))
        self.encoder = nn.TransformerEncoder(_layer(True, norm_first=True), num_layers=1, enable_nested_tensor=False)
        self.out = nn.Linear(D, V, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.out(self.encoder(self.embed(ids) + self.pos, mask=causal, is_causal=True))


class Decoder(nn.Module):
    """nn.TransformerDecoderLayer over target tokens with a memory computed from input features."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(V, D)
        self.memory = nn.Linear(5, D)
        self.decoder = nn.TransformerDecoderLayer(D, HEADS, dim_feedforward=12, dropout=0.0, batch_first=batch_first)
        self.head = nn.Linear(D, 3)

    def forward(self, inputs):
        ids, feats = inputs[..., 0].long(), inputs[..., 1:]
        tgt, memory = self.embed(ids), self.memory(feats)
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        if not self.batch_first:
            tgt, memory = tgt.transpose(0, 1), memory.transpose(0, 1)
        h = self.decoder(tgt, memory, tgt_mask=causal)
        return self.head((h if self.batch_first else h.transpose(0, 1))[:, -1])


class ViT(nn.Module):
    """A ViT as in tutorials: patch Conv2d, class token and positional table as bare parameters of the model,
    pre-norm nn.TransformerEncoder, head on the class token."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, D, 4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, 5, D))
        self.encoder = nn.TransformerEncoder(_layer(True, norm_first=True, activation="gelu"), num_layers=2,
                                             enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, 3)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(tokens))[:, 0])


def _ids(b: int = 4, seed: int = 1, padded: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (b, T), generator=g)
    if padded:
        ids[0, -2:] = 0                                           # sample 0 ends with two padding tokens
    return ids


def _labels(b: int = 4, classes: int = 3) -> torch.Tensor:
    return torch.arange(b) % classes


def _decoder_inputs(b: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    return torch.cat([torch.randint(0, V, (b, T, 1), generator=g).double(), torch.randn(b, T, 5, generator=g)], -1)


def _images(b: int = 4) -> torch.Tensor:
    return torch.randn(b, 3, 8, 8, generator=torch.Generator().manual_seed(3))


ZOO = {
    "encoder_batch_first": (lambda: Encoder(True), _ids, _labels),
    "encoder_sequence_first": (lambda: Encoder(False), _ids, _labels),
    "encoder_norm_first_padding_mask": (lambda: Encoder(True, padding=True, norm_first=True),
                                        lambda: _ids(padded=True), _labels),
    "tied_causal_lm": (TiedLM, _ids, lambda: _ids(seed=4)),
    "decoder_batch_first": (lambda: Decoder(True), _decoder_inputs, _labels),
    "decoder_sequence_first": (lambda: Decoder(False), _decoder_inputs, _labels),
    "vit_cls_token_pos_table": (ViT, _images, _labels),
}


@pytest.mark.parametrize("name", ZOO)
def test_zoo_norms_match_vmap(name):
    """Every parameter of the model (attention projections, bare tables and tokens, tied embeddings) gets its
    per-sample gradient norm from one forward and one backward, equal to vmap's per-sample gradients."""
    build, inputs, labels = ZOO[name]
    model, x, y = _randomize(build()), inputs(), labels()
    ours = per_sample_grad_norms(model, ce, x, y)
    ref = vmap_norms(model, ce, x, y)
    assert torch.all(ref > 0)
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=0)


@pytest.mark.parametrize("kw", [
    {}, {"add_bias_kv": True}, {"add_zero_attn": True}, {"kdim": 5, "vdim": 3}, {"bias": False},
    {"add_bias_kv": True, "add_zero_attn": True, "batch_first": True}],
    ids=["plain", "bias_kv", "zero_attn", "separate_kv_dims", "no_bias", "bias_kv_zero_attn_batch_first"])
@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "sdpa"])
def test_multihead_attention_variants(kw, need_weights):
    """nn.MultiheadAttention alone, each optional parameter and input layout, cross-attention (query, key and value
    different tensors) with a key padding mask: norms equal to vmap's; the traced forward returns torch's outputs
    and attention weights, and leaves the module as it was."""
    batch_first = kw.get("batch_first", False)
    kdim, vdim = kw.get("kdim", D), kw.get("vdim", D)

    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.head = nn.MultiheadAttention(D, HEADS, **kw), nn.Linear(D, 3)

        def forward(self, x):
            q, k, v = x[..., :D], x[..., D:D + kdim], x[..., D + kdim:D + kdim + vdim]
            mask = x[..., -1] > 1.5                         # per sample (sample 0: its last key)
            if not batch_first:
                q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
            out, weights = self.attn(q, k, v, key_padding_mask=mask, need_weights=need_weights)
            self.weights = weights
            out = out if batch_first else out.transpose(0, 1)
            return self.head(out.mean(1))

    model = _randomize(Cross())
    x = torch.randn(4, T, D + kdim + vdim, generator=torch.Generator().manual_seed(6)).clamp(max=1.0)
    x[0, -1, -1] = 2.0
    state = {k: v.clone() for k, v in model.state_dict().items()}
    plain_out, plain_weights = model(x), model.weights
    with Tape(model):
        traced_out, traced_weights = model(x), model.weights
        assert "forward" in model.attn.__dict__
    assert "forward" not in model.attn.__dict__
    torch.testing.assert_close(traced_out, plain_out, rtol=0, atol=1e-14)
    if need_weights:
        torch.testing.assert_close(traced_weights, plain_weights, rtol=0, atol=1e-14)
    else:
        assert traced_weights is None and plain_weights is None
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    ours = per_sample_grad_norms(model, ce, x, _labels())
    torch.testing.assert_close(ours, vmap_norms(model, ce, x, _labels()), rtol=RTOL, atol=0)


def test_self_and_cross_attention_through_one_module_include_the_cross_terms():
    """One nn.MultiheadAttention used for self-attention (packed q, k, v rows) and then for cross-attention (q and
    a packed k, v): its in-projection blocks overlap across the calls and are joined per block."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.head = nn.MultiheadAttention(D, HEADS, batch_first=True), nn.Linear(D, 3)

        def forward(self, x):
            h = self.attn(x, x, x, need_weights=False)[0]
            return self.head(self.attn(h, x, x, need_weights=False)[0].mean(1))

    x = torch.randn(4, T, D, generator=torch.Generator().manual_seed(7))
    model = _randomize(Twice())
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, _labels()), vmap_norms(model, ce, x, _labels()),
                               rtol=RTOL, atol=0)


def test_evaluation_runs_torchs_own_attention():
    """Under no_grad (evaluation, where torch may take its fused fast path) the tape's forward is torch's own, so
    evaluation is unchanged: equal outputs with and without the tape."""
    model = _randomize(Encoder(True)).eval()
    x = _ids()
    with torch.no_grad():
        plain = model(x)
        with Tape(model):
            traced = model(x)
    assert torch.equal(plain, traced)


def test_private_step_through_the_dp_callback_on_a_transformer():
    """The dp callback on the ViT of the zoo (bare class token and table, nn.TransformerEncoderLayer): with the
    noise off, the private gradient equals Σ_i C_i g_i / B̄ with C_i from naive per-sample gradients."""
    model, clip = _randomize(ViT()), 1.4
    x, y = _images(6), _labels(6)
    params, grads = per_sample_grads(model, x, y)
    norms = torch.stack([sum(t.square().sum() for t in gi).sqrt() for gi in grads])
    assert (norms > clip).any() and (norms < clip).any()
    factors = (clip / (norms + 1e-6)).clamp(max=1)
    expected = [sum(factors[i] * grads[i][k] for i in range(6)) / 8 for k in range(len(params))]
    callback = private_callback(model, clip=clip)
    callback.call.sigma = 0.0
    callback.on_batch_start(x, y)
    F.cross_entropy(model(x), y).backward()
    callback.after_backward(model)
    callback.close()
    for p, want in zip(params, expected):
        torch.testing.assert_close(p.grad, want, rtol=1e-9, atol=1e-12)


class _Scaled(nn.Module):
    def __init__(self, use):
        super().__init__()
        self.use, self.scale, self.head = use, nn.Parameter(torch.ones(1, 1, D)), nn.Linear(D, 3)

    def forward(self, x):
        return self.head(self.use(x, self.scale).mean(1))


@pytest.mark.parametrize("use, why", [
    (lambda x, p: x * p, "not a shape change, an addition or a concatenation"),
    (lambda x, p: x + 2 * p, "not a shape change, an addition or a concatenation"),
    (lambda x, p: torch.add(x, p, alpha=2.0), "combined with another parameter or scaled"),
    (lambda x, p: torch.cat([p.expand(1, T, -1), x[1:]], 0), "concatenated along the sample dimension"),
    (lambda x, p: torch.cat([p.expand(len(x), -1, -1).clone(), x], 1), "without being copied per sample"),
], ids=["product", "scaled_first", "alpha", "cat_on_samples", "cat_not_expanded"])
def test_bare_parameter_used_otherwise_is_refused_naming_it(use, why):
    """A bare parameter that does not simply enter the activations additively or by concatenation: one line naming
    the module type, its parameters, the parameter and why (a rule is needed)."""
    x = torch.randn(4, T, D, generator=torch.Generator().manual_seed(8))
    with pytest.raises(UnsupportedLayerError, match=f"no rule for _Scaled, which owns trainable parameters "
                                                    f"\\['scale'\\]; its parameter 'scale' .*({why})"):
        per_sample_grad_norms(_Scaled(use), ce, x, _labels())


def test_bare_parameter_inside_a_sample_second_layer_is_refused():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.shift = nn.Parameter(torch.zeros(D))

        def forward(self, x):
            return x + self.shift

    model = nn.Sequential(nn.TransformerEncoderLayer(D, HEADS, 12, 0.0), nn.Linear(D, 3))
    model[0].linear1 = nn.Sequential(model[0].linear1, Scaled())
    with pytest.raises(UnsupportedLayerError, match="no rule for .*Scaled at '0.linear1.1'.*sample-second tensors"):
        Tape(model)
