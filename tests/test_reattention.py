"""Re-Attention (Ding et al., ICML 2024): the score correction against a hand computation, the log-normal identity
it rests on, σ = 0 = vanilla attention exactly, and the variance propagation against Monte Carlo."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from clbench.models.seqrec import SeqRec
from clbench.privacy.reattention import (
    CausalSelfAttention,
    ErrorPrior,
    ReAttention,
    activation_var,
    layer_norm_var,
    linear_var,
)


def test_correction_equals_a_hand_computation():
    torch.manual_seed(0)
    d, n, s = 4, 3, 0.01                                     # dim, tokens, σ_eff² of every weight and bias
    attn = ReAttention(d, heads=1).double()
    x = torch.randn(1, n, d, dtype=torch.float64)
    v = torch.rand(1, n, d, dtype=torch.float64)             # Var x
    pad = torch.zeros(1, n, dtype=torch.bool)
    out, _ = attn(x, pad, v, s)

    wq, bq, wk, bk = attn.q.weight, attn.q.bias, attn.k.weight, attn.k.bias
    expected = []
    for i in range(n):
        q = (wq @ x[0, i] + bq) / math.sqrt(d)
        c = float(q @ q)                                                      # C = <q̃, q̃>
        weights = []
        for j in range(i + 1):                                                # causal
            k = wk @ x[0, j] + bk
            var_k = [sum(float(wk[r, m]) ** 2 * float(v[0, j, m]) for m in range(d))
                     + s * (sum(float(x[0, j, m]) ** 2 + float(v[0, j, m]) for m in range(d)) + 1) for r in range(d)]
            sigma2 = sum(var_k) / d
            weights.append(math.exp(float(q @ k)) / math.exp(c * sigma2 / 2))   # S_j / exp(C σ_j² / 2)
        total = sum(weights)
        mixed = sum(w / total * (attn.v.weight @ x[0, j] + attn.v.bias) for j, w in enumerate(weights))
        expected.append(attn.proj.weight @ mixed + attn.proj.bias)
    torch.testing.assert_close(out[0], torch.stack(expected), rtol=1e-10, atol=1e-12)
    vanilla, _ = CausalSelfAttention.forward(attn, x, pad)                    # same weights, no correction
    assert not torch.allclose(vanilla, out, atol=1e-6)                        # the correction changed something


def test_the_correction_removes_the_lognormal_bias_of_noisy_keys():
    # E[exp<q, k>] for k ~ N(mu, σ² I) is exp(<q, mu>) exp(C σ²/2), C = <q, q>: dividing by it is unbiased
    torch.manual_seed(1)
    q, mu, sigma = torch.randn(8, dtype=torch.float64) * 0.5, torch.randn(8, dtype=torch.float64), 0.4
    k = mu + sigma * torch.randn(400_000, 8, dtype=torch.float64)
    c = float(q @ q)
    corrected = (torch.exp(k @ q) / math.exp(c * sigma**2 / 2)).mean()
    assert float(corrected) == pytest.approx(math.exp(float(q @ mu)), rel=5e-3)


def test_zero_noise_is_vanilla_attention_exactly():
    torch.manual_seed(2)
    items = torch.randint(0, 51, (5, 12))
    items[:, :4] = 0
    vanilla = SeqRec(50, 12, dim=16, attention="vanilla").eval()
    re = SeqRec(50, 12, dim=16, attention="reattention").eval()
    re.load_state_dict(vanilla.state_dict())
    re.set_error_prior(ErrorPrior(0.0, 32, torch.rand(51)))
    assert torch.equal(vanilla(items), re(items))
    frequent_or_rare = torch.where(torch.arange(51) % 2 == 0, 1.0, 0.001)
    re.set_error_prior(ErrorPrior(0.5, 32, frequent_or_rare))
    assert (vanilla(items) - re(items)).abs().max() > 1e-3                   # σ > 0 does change the scores
    attn = ReAttention(16, heads=2).eval()
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    assert torch.equal(attn(x, pad, torch.zeros_like(x), 0.0)[0], CausalSelfAttention.forward(attn, x, pad)[0])


def test_noisier_keys_get_less_attention():
    torch.manual_seed(3)
    attn = ReAttention(8, heads=1).double()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    pad = torch.zeros(1, 4, dtype=torch.bool)
    captured = []                                                             # attention weights (B, H, L, L)
    attn.dropout.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    var = torch.zeros_like(x)
    attn(x, pad, var, 0.0)
    var[0, 1] = 5.0                                                           # key 1 is much noisier
    attn(x, pad, var, 0.0)
    before, after = captured[0][0, 0, 3], captured[1][0, 0, 3]               # the last query's weights
    assert after[1] < before[1] and torch.all(after[[0, 2, 3]] > before[[0, 2, 3]])
    torch.testing.assert_close(after.sum(), torch.tensor(1.0, dtype=torch.float64))   # renormalized


def test_error_prior_effective_errors():
    freq = torch.tensor([0.0, 0.5, 0.01, 0.0])
    prior = ErrorPrior(sigma_dp=2.0, batch_size=100, token_frequency=freq)
    assert prior.dense_var == pytest.approx((2.0 / 100) ** 2)                # σ_eff = σ_dp / B
    torch.testing.assert_close(prior.token_var(), torch.tensor([4.0, (2 / 50) ** 2, 4.0, 4.0]))  # B_eff = B p_j ≥ 1
    assert not ErrorPrior(0.0, 10, freq).active
    with pytest.raises(ValueError, match="sigma_dp >= 0"):
        ErrorPrior(-1.0, 10, freq)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_variance_propagation_matches_monte_carlo(activation):
    """Linear -> LayerNorm -> activation (the model's width d = 64) with noisy inputs AND noisy weights, biases and
    LayerNorm parameters. The Linear's weight noise is sampled through its exact distribution: for weights
    ``W + N(0, s)`` entrywise, ``(ΔW x)_o ~ N(0, s ‖x‖²)`` independently per output ``o``."""
    torch.manual_seed(4)
    d = 64
    lin, ln = nn.Linear(d, d).double(), nn.LayerNorm(d).double()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.3, 0.3)
    x = torch.randn(d, dtype=torch.float64)
    v = 0.01 * torch.rand(d, dtype=torch.float64)                             # Var x
    s = 1e-4        # σ_eff² of every parameter (σ_dp / B at B = 128 and σ_dp ≈ 1.3: the DP runs' dense error)

    z = lin(x).detach()
    z_var = linear_var(x, v, lin, s).detach()
    a = ln(z).detach()
    a_var = layer_norm_var(z, z_var, ln, s).detach()
    out_var = activation_var(activation, a, a_var)

    m = 200_000
    with torch.no_grad():
        xs = x + v.sqrt() * torch.randn(m, d, dtype=torch.float64)
        zs = lin(xs) + (s * (xs.square().sum(1, keepdim=True) + 1)).sqrt() * torch.randn(m, d, dtype=torch.float64)
        gamma = ln.weight + math.sqrt(s) * torch.randn(m, d, dtype=torch.float64)
        beta = ln.bias + math.sqrt(s) * torch.randn(m, d, dtype=torch.float64)
    torch.testing.assert_close(zs.var(0), z_var, rtol=0.03, atol=0)          # Linear: exact
    xhat = (zs - zs.mean(1, keepdim=True)) / (zs.var(1, unbiased=False, keepdim=True) + ln.eps).sqrt()
    a_mc = gamma * xhat + beta
    torch.testing.assert_close(a_mc.var(0), a_var, rtol=0.06, atol=0)       # LayerNorm: first order
    out_mc = (F.gelu if activation == "gelu" else F.relu)(a_mc).var(0)
    # relative to each coordinate, except where the output barely varies (GELU's flat minimum, ReLU's zero side)
    torch.testing.assert_close(out_mc, out_var, rtol=0.1, atol=0.05 * float(out_mc.median()))


def test_activation_moment_matching_is_exact_for_gaussian_inputs():
    torch.manual_seed(5)
    mu = torch.tensor([-1.0, 0.0, 0.7, 2.0], dtype=torch.float64)
    var = torch.tensor([0.5, 1.0, 0.2, 3.0], dtype=torch.float64)
    samples = mu + var.sqrt() * torch.randn(1_000_000, 4, dtype=torch.float64)
    for kind, fn in (("relu", F.relu), ("gelu", F.gelu)):
        torch.testing.assert_close(activation_var(kind, mu, var), fn(samples).var(0), rtol=0.01, atol=0)
