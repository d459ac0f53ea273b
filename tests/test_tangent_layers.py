"""Each closed-form tangent layer against torch.func.jvp, in float64: (y, ẏ) = (f(x; w0), ∂f/∂x ẋ + ∂f/∂w Δ); and its
gradients in (ẋ, Δ), through the fused kernels, against finite differences."""

import pytest
import torch
from timm.layers import LayerScale, Mlp
from timm.models.vision_transformer import Attention, Block
from torch import nn
from torch.func import functional_call, jvp

from clbench.tangent.layers import (
    TangentAttention,
    TangentBlock,
    TangentGELU,
    TangentLayerNorm,
    TangentLayerScale,
    TangentLinear,
    TangentMlp,
)

B, N, D = 3, 7, 16


pytestmark = pytest.mark.usefixtures("float64")    # every check runs in float64 (tests/conftest.py)


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def randomize(module: nn.Module, scale: float = 0.3) -> nn.Module:
    """Move w0 away from the default init (LayerNorm γ=1, β=0, ...) so every term of the tangent is exercised."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


def reference(module: nn.Module, x, xd, delta, dtype=torch.float64):
    """``torch.func.jvp`` of ``(x, w) -> module(x; w)`` at ``(x, w0)`` along ``(ẋ, Δ)``."""
    w0 = {n: p.detach() for n, p in module.named_parameters()}
    tangents = {n: delta.get(n, torch.zeros_like(p)) for n, p in w0.items()}
    return jvp(lambda inp, w: functional_call(module, w, (inp,)), (x, w0), (xd, tangents))


def check(module: nn.Module, tangent: nn.Module, shape=(B, N, D), delta_scale=0.5, with_xd=True):
    torch.manual_seed(1)
    x = torch.randn(*shape)
    xd = torch.randn(*shape) if with_xd else torch.zeros(*shape)
    with torch.no_grad():
        for p in tangent.parameters():
            p.copy_(delta_scale * torch.randn_like(p))
    delta = {n: p.detach() for n, p in tangent.named_parameters()}
    assert set(delta) <= {n for n, _ in module.named_parameters()}, "Δ names must be the original parameter names"
    y_ref, yd_ref = reference(module, x, xd, delta)
    y, yd = tangent(x, xd if with_xd else None)
    assert rel_err(y, y_ref) < 1e-12
    assert rel_err(yd, yd_ref) < 1e-9


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    torch.manual_seed(0)
    lin = nn.Linear(D, 2 * D, bias=bias)
    check(lin, TangentLinear(lin))


def test_gelu_erf_form():
    act = nn.GELU()
    check(act, TangentGELU(act), shape=(B, N, D))
    with pytest.raises(ValueError):
        TangentGELU(nn.GELU(approximate="tanh"))


@pytest.mark.parametrize("with_xd", [True, False])
def test_layernorm_through_mean_and_variance(with_xd):
    torch.manual_seed(0)
    norm = randomize(nn.LayerNorm(D))
    check(norm, TangentLayerNorm(norm), with_xd=with_xd)


def test_layerscale():
    torch.manual_seed(0)
    ls = randomize(LayerScale(D, init_values=0.1))
    check(ls, TangentLayerScale(ls))


@pytest.mark.parametrize("heads,qkv_bias", [(1, True), (2, False), (4, True)])
def test_attention(heads, qkv_bias):
    torch.manual_seed(0)
    attn = randomize(Attention(D, num_heads=heads, qkv_bias=qkv_bias), 0.2)
    attn.fused_attn = False
    check(attn, TangentAttention(attn), delta_scale=0.2)


def test_mlp():
    torch.manual_seed(0)
    mlp = randomize(Mlp(D, 2 * D), 0.2)
    check(mlp, TangentMlp(mlp))


@pytest.mark.parametrize("init_values", [None, 0.5])
def test_block_with_residuals(init_values):
    torch.manual_seed(0)
    block = randomize(Block(D, num_heads=2, qkv_bias=True, init_values=init_values), 0.2)
    block.attn.fused_attn = False
    check(block, TangentBlock(block), delta_scale=0.2)


def test_frozen_layer_propagates_tangent_only():
    """``delta=False``: no Δ parameters, ẏ = ∂f/∂x ẋ, and ẋ = None gives ẏ = None at plain-forward cost."""
    torch.manual_seed(0)
    block = randomize(Block(D, num_heads=2), 0.2)
    block.attn.fused_attn = False
    frozen = TangentBlock(block, delta=False)
    assert list(frozen.parameters()) == []
    check(block, frozen)
    x = torch.randn(B, N, D)
    y, yd = frozen(x, None)
    assert yd is None and rel_err(y, block(x)) < 1e-12


def check_gradients(tangent: nn.Module, shape=(2, 5, 8), with_xd=True):
    """``Δ`` trains through the fused kernels: autograd's gradients of ``ẏ`` in ``(ẋ, Δ)`` equal finite differences
    (``torch.autograd.gradcheck``; ``ẏ`` is linear in both, so the differences are exact up to rounding)."""
    torch.manual_seed(2)
    x = torch.randn(*shape)
    names = [n for n, _ in tangent.named_parameters()]
    inputs = ([torch.randn(*shape)] if with_xd else []) + [0.3 * torch.randn_like(p) for p in tangent.parameters()]
    inputs = [t.requires_grad_() for t in inputs]

    def tangent_output(*args):
        delta = dict(zip(names, args[len(args) - len(names):]))
        return functional_call(tangent, delta, (x, args[0] if with_xd else None))[1]

    assert torch.autograd.gradcheck(tangent_output, inputs)


@pytest.mark.parametrize("make", [
    lambda: TangentLinear(nn.Linear(8, 12)),
    lambda: TangentGELU(nn.GELU()),
    lambda: TangentLayerNorm(randomize(nn.LayerNorm(8))),
    lambda: TangentAttention(randomize(Attention(8, num_heads=2, qkv_bias=True), 0.2)),
    lambda: TangentBlock(randomize(Block(8, num_heads=2, mlp_ratio=2.0, init_values=0.5), 0.2)),
], ids=["linear", "gelu", "layernorm", "attention", "block"])
def test_gradients_in_tangent_and_delta(make):
    torch.manual_seed(0)
    check_gradients(make())


def test_gradients_without_input_tangent():
    torch.manual_seed(0)
    check_gradients(TangentLayerNorm(randomize(nn.LayerNorm(8))), with_xd=False)
    check_gradients(TangentBlock(randomize(Block(8, num_heads=2, mlp_ratio=2.0), 0.2)), with_xd=False)


def test_layernorm_point_is_a_constant():
    """The fused LayerNorm Jacobian is differentiable in ẋ only; the primal x never depends on Δ."""
    norm = TangentLayerNorm(nn.LayerNorm(D))
    with pytest.raises(ValueError):
        norm(torch.randn(B, N, D, requires_grad=True), torch.randn(B, N, D))
