"""Private training of transformers written the usual PyTorch way (the zoo of tests/_transformer_zoo.py): per-sample
gradient norms (clbench.privacy) of models built from nn.TransformerEncoderLayer / nn.TransformerDecoderLayer /
nn.MultiheadAttention and bare nn.Parameters (positional tables, class tokens) against torch.func's vmap(grad)
per-sample gradients in float64; the idioms of GPT-2/BERT/nanoGPT-style code (tied heads written on the weight,
positions without the batch dimension, layer scale as bare parameters, a Linear's weight reused) and the packed-rows
layout likewise; models built to slip past the rules refused by the first-step invariant, before training; the
traced attention forward against torch's (outputs, weights, state dicts); one full private step through the dp
callback against a naive per-sample clip-and-sum; the refusals of bare parameters used otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clbench.privacy import UnsupportedLayerError, per_sample_grad_norms
from clbench.privacy.tape import Tape
from tests._transformer_zoo import (
    COVERAGE,
    IDIOMS,
    SLIPPING,
    ZOO,
    EinsumHead,
    Encoder,
    PackedLM,
    Sizes,
    ViT,
    ids,
    images,
    labels,
    packed_inputs,
    sample_losses,
)
from tests.test_privacy_dp import per_sample_grads, private_callback
from tests.test_privacy_norms import RTOL, ce, loop_norms, vmap_norms

pytestmark = pytest.mark.usefixtures("float64")

SIZES = Sizes()
T, D, HEADS = SIZES.length, SIZES.dim, SIZES.heads


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (torch leaves some biases and tables at zero) so every one reaches the loss."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.train()


def _labels(b: int = 4) -> torch.Tensor:
    return labels(SIZES, b)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_norms_match_vmap(name):
    """Every parameter of the model (attention projections, bare tables and tokens, tied embeddings) gets its
    per-sample gradient norm from one forward and one backward, equal to vmap's per-sample gradients."""
    build, inputs, targets = ZOO[name]
    model, x, y = _randomize(build(SIZES)), inputs(SIZES, 4), targets(SIZES, 4)
    ours = per_sample_grad_norms(model, ce, x, y)
    ref = vmap_norms(model, ce, x, y)
    assert torch.all(ref > 0)
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=0)


@pytest.mark.parametrize("name", IDIOMS)
def test_idioms_norms_match_vmap(name):
    """GPT-2's ``h @ wte.weight.T``, BERT's ``F.linear(h, wte.weight) + bias``, nanoGPT's ``wpe(arange(T))``
    broadcast over the batch with its Linear-tied head, layer scale ``h * gamma`` as bare parameters, and
    ``z @ fc.weight`` outside the Linear: every parameter's per-sample norm equals vmap's (the first-step invariant
    holds in per_sample_grad_norms)."""
    build, inputs, targets = IDIOMS[name]
    model, x, y = _randomize(build(SIZES)), inputs(SIZES, 4), targets(SIZES, 4)
    ours = per_sample_grad_norms(model, ce, x, y)
    ref = vmap_norms(model, ce, x, y)
    assert torch.all(ref > 0)
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=0)


def test_packed_rows_layout_matches_vmap_of_the_same_loss_over_every_position():
    """The tied head on packed rows (the target positions of all samples, each with its sample index): the
    Embedding's lookups and the head's rows clipped as one parameter (cross term on rows) equal vmap's per-sample
    gradients of the same loss written over every position (the packed layout's data-dependent shape cannot be
    vmapped)."""
    model = _randomize(PackedLM(SIZES))
    dense = PackedLM(SIZES, dense=True)
    dense.load_state_dict(model.state_dict())
    x, unused = packed_inputs(SIZES, 5), torch.zeros(5)
    torch.testing.assert_close(model(x), dense(x), rtol=1e-12, atol=0)
    ours = per_sample_grad_norms(model, sample_losses, x, unused)
    torch.testing.assert_close(ours, vmap_norms(dense, sample_losses, x, unused), rtol=RTOL, atol=0)


@pytest.mark.parametrize("name", SLIPPING)
def test_models_built_to_slip_past_the_rules_are_refused_by_the_invariant(name):
    """No structural check objects to these models (every layer is called, every parameter is seen by a hook), yet
    the rules explain only part of a parameter's gradient: one line naming the parameter and its unaccounted use."""
    build, inputs, targets, named = SLIPPING[name]
    model, x, y = _randomize(build(SIZES)), inputs(SIZES, 4), targets(SIZES, 4)
    with pytest.raises(UnsupportedLayerError, match=f"explain only part of the gradient of parameter "
                                                    f"(wte|fc).weight .*{named}"):
        per_sample_grad_norms(model, ce, x, y)


def test_the_first_private_step_refuses_a_slipping_model_before_it_trains():
    """Through the dp callback: the first step stops in after_backward (before the optimizer steps) naming the
    tied weight and ``einsum``; no parameter has moved."""
    model = _randomize(EinsumHead(SIZES))
    x, y = ids(SIZES, 6), ids(SIZES, 6, seed=4)
    callback = private_callback(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    callback.on_batch_start(x, y)
    loss = ce(model(x), y).mean()
    callback.after_forward(loss)
    loss.backward()
    with pytest.raises(UnsupportedLayerError, match=r"parameter wte.weight \(\d+\.\d% of it unaccounted: its use in "
                                                    r"einsum outside its layer's forward\)"):
        callback.after_backward(model)
        optimizer.step()
    callback.close()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


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
    model = _randomize(Encoder(SIZES, True)).eval()
    x = ids(SIZES, 4)
    with torch.no_grad():
        plain = model(x)
        with Tape(model):
            traced = model(x)
    assert torch.equal(plain, traced)


def test_private_step_through_the_dp_callback_on_a_transformer():
    """The dp callback on the ViT of the zoo (bare class token and table, nn.TransformerEncoderLayer): with the
    noise off, the private gradient equals Σ_i C_i g_i / B̄ with C_i from naive per-sample gradients."""
    model, clip = _randomize(ViT(SIZES)), 1.4
    x, y = images(SIZES, 6), _labels(6)
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


@pytest.mark.parametrize("use", [
    lambda x, p: x / p, lambda x, p: x + 2 * p, lambda x, p: x * (p * p), lambda x, p: torch.add(x, p, alpha=2.0),
    lambda x, p: torch.cat([p.expand(len(x), -1, -1).clone(), x], 1),
], ids=["quotient", "scaled_first", "squared", "alpha", "cat_not_expanded"])
def test_bare_parameter_used_otherwise_is_replayed_exactly(use):
    """A bare parameter that does not simply enter the activations additively, as a factor or by concatenation
    (the bare-parameter rule stops following it): the module's call is replayed per sample
    (clbench.privacy.fallback), equal to vmap's per-sample gradients."""
    x = torch.randn(4, T, D, generator=torch.Generator().manual_seed(8))
    model = _Scaled(use)
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, _labels()), vmap_norms(model, ce, x, _labels()),
                               rtol=RTOL, atol=0)


def test_bare_parameter_put_in_place_of_a_sample_is_refused_naming_it():
    """``cat([P, x[1:]], 0)``: the parameter takes sample 0's place; no replay of one sample gives that: the replay
    does not reproduce the call's output and the module is refused by name."""
    x = torch.randn(4, T, D, generator=torch.Generator().manual_seed(8))
    model = _Scaled(lambda x, p: torch.cat([p.expand(1, T, -1), x[1:]], 0))
    with pytest.raises(UnsupportedLayerError, match=r"_Scaled at '<root>'.*did not reproduce its output.*a "
                                                    r"parameter takes a sample's place"):
        per_sample_grad_norms(model, ce, x, _labels())


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


def _norms_or_refusal(model, x, y, norms) -> torch.Tensor | None:
    try:
        return norms(model, x, y)
    except Exception:                     # noqa: BLE001 - any refusal (ours: UnsupportedLayerError; opacus: several)
        return None


def _ours(model, x, y):
    return per_sample_grad_norms(model, ce, x, y)


def _opacus(model, x, y):
    from opacus import GradSampleModule
    wrapped = GradSampleModule(model, loss_reduction="sum")
    ce(wrapped(x), y).sum().backward()
    grads = [p.grad_sample for p in model.parameters() if p.requires_grad]
    if any(g is None for g in grads):
        raise RuntimeError("a trained parameter got no per-sample gradient")
    return torch.stack([g.flatten(1).square().sum(1) for g in grads]).sum(0).sqrt()


def _status(name: str, norms) -> str:
    """``exact`` (equal to the per-sample loop's norms to 1e-6), ``refused`` (raised) or ``silently wrong``; a model
    that mixes samples has no per-sample gradient, so any number is wrong."""
    build, inputs, targets, mixes = COVERAGE[name]
    torch.manual_seed(0)
    model, x, y = _randomize(build(SIZES)), inputs(SIZES, 4), targets(SIZES, 4)
    got = _norms_or_refusal(model, x, y, norms)
    if got is None:
        return "refused"
    if mixes:
        return "silently wrong"
    torch.manual_seed(0)
    fresh = _randomize(build(SIZES))
    want = loop_norms(fresh, ce, x, y)
    return "exact" if torch.allclose(got, want, rtol=RTOL, atol=0) else "silently wrong"


def _documented() -> dict[str, tuple[str, str]]:
    """The coverage table of docs/privacy.md: idiom -> (clbench, opacus)."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "privacy.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_the_coverage_zoo_has_at_least_25_idioms_and_the_docs_list_them_all():
    assert len(COVERAGE) >= 25
    assert set(_documented()) == set(COVERAGE)


@pytest.mark.parametrize("name", COVERAGE)
def test_coverage_table_in_the_docs_holds(name):
    """Each idiom of the coverage zoo (float64, against one backward per sample): clbench's status and opacus's
    (GradSampleModule, its per-layer samplers and functorch fallback) are the ones the table of docs/privacy.md
    states, and clbench is never silently wrong."""
    ours, theirs = _documented()[name]
    assert ours != "silently wrong"
    assert _status(name, _ours) == ours
    assert _status(name, _opacus) == theirs
