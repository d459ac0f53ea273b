"""The exact fallback (clbench.privacy.fallback): per-sample gradients of a module without a ghost rule replayed with
torch.func — a parameter the root module uses directly, a parametrized layer — against vmap in float64, and its
refusals (a random operation, an autograd.Function without vmap support) naming the module, before any step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clbench.privacy import UnsupportedLayerError, fallback, per_sample_grad_norms
from clbench.privacy.tape import Tape
from tests._transformer_zoo import _Square
from tests.test_privacy_rules import RTOL, ce, vmap_norms

pytestmark = pytest.mark.usefixtures("float64")


class Direct(nn.Module):
    """The root's own parameter used through F.linear and a Gram product, beside a Linear."""

    def __init__(self, use) -> None:
        super().__init__()
        self.use, self.w, self.head = use, nn.Parameter(torch.randn(6, 6) * 0.4), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.use(x, self.w))


def _data(b=5):
    g = torch.Generator().manual_seed(0)
    return torch.randn(b, 6, generator=g), torch.arange(b) % 3


@pytest.mark.parametrize("use", [lambda x, w: torch.tanh(F.linear(x, w)), lambda x, w: torch.tanh(x @ (w @ w.T)),
                                 lambda x, w: torch.einsum("bd,ed->be", torch.tanh(F.linear(x, w)), w)],
                         ids=["f_linear", "gram", "twice"])
def test_a_parameter_the_root_uses_directly_is_replayed_exactly(use):
    model = Direct(use)
    x, y = _data()
    with Tape(model) as tape:
        assert tape.rules[model] is fallback.OWNED
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)


def test_a_weight_norm_layer_is_replayed_whole_with_its_originals():
    layer = nn.utils.parametrizations.weight_norm(nn.Linear(6, 6))
    model = nn.Sequential(layer, nn.Tanh(), nn.Linear(6, 3))
    x, y = _data()
    with Tape(model) as tape:
        assert tape.rules[layer] is fallback.REPLAYED
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)


def test_replays_are_chunked_and_equal_whatever_the_chunk(monkeypatch):
    model = Direct(lambda x, w: torch.tanh(x @ (w @ w.T)))
    x, y = _data(7)
    whole = per_sample_grad_norms(model, ce, x, y)
    monkeypatch.setattr(fallback, "CHUNK", 2)
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), whole, rtol=1e-12, atol=0)


@pytest.mark.parametrize("use, named", [
    (lambda x, w: _Square.apply(x @ w), "autograd.Function"),
    (lambda x, w: F.dropout(x @ w, 0.5, True), "random"),
], ids=["function_without_vmap", "dropout"])
def test_what_cannot_be_replayed_is_refused_naming_the_module(use, named):
    x, y = _data()
    with pytest.raises(UnsupportedLayerError, match=f"Direct at '<root>' has no ghost rule and torch.func could not "
                                                    f"replay its forward per sample .*{named}"):
        per_sample_grad_norms(Direct(use), ce, x, y)


class Masked(nn.Module):
    """Attention over each sample's tokens with a bare query map and a causal ``(T, T)`` mask shared by the samples,
    in a child module without a ghost rule (replayed) called with the mask as an argument, beside a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.mix, self.head = _Mix(), nn.Linear(6, 3)

    def forward(self, x):
        t = x.shape[1]
        return self.head(self.mix(x, torch.full((t, t), float("-inf")).triu(1)).mean(1))


class _Mix(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 6) * 0.4)

    def forward(self, x, mask):
        return torch.softmax((x @ self.w) @ x.transpose(1, 2) + mask, -1) @ x


def test_a_shared_mask_whose_size_is_not_the_batch_is_given_whole_and_exact():
    model = Masked()
    x, y = torch.randn(5, 4, 6, generator=torch.Generator().manual_seed(3)), torch.arange(5) % 3
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)


def test_a_shared_mask_whose_leading_size_equals_the_batch_is_refused_not_split():
    """A (T, T) mask with T = B looks like a per-sample input; the replay, which would split it by sample, does not
    reproduce the module's output and the call is refused in one line (never a wrong norm)."""
    model = Masked()
    x, y = torch.randn(4, 4, 6, generator=torch.Generator().manual_seed(3)), torch.arange(4) % 3
    with pytest.raises(UnsupportedLayerError, match=r"_Mix at 'mix'.*did not reproduce its output.*\(T, T\) mask"):
        per_sample_grad_norms(model, ce, x, y)


@pytest.mark.parametrize("recompute", [
    lambda layer: nn.utils.weight_norm(layer),
    lambda layer: nn.utils.prune.random_unstructured(layer, "weight", amount=0.5)],
    ids=["hook_weight_norm", "prune"])
def test_a_layer_whose_weight_a_pre_hook_recomputes_is_replayed_exactly(recompute, recwarn):
    """The old hook-based weight_norm and torch's pruning replace a Linear's weight by other parameters through a
    forward pre-hook: the Linear rule does not apply, the call is replayed (the hook included)."""
    torch.manual_seed(0)
    layer = recompute(nn.Linear(6, 6))
    model = nn.Sequential(layer, nn.Tanh(), nn.Linear(6, 3))
    x, y = _data()
    with Tape(model) as tape:
        assert tape.rules[layer] is fallback.OWNED
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)


def test_the_old_spectral_norm_is_refused_by_the_invariant(recwarn):
    """spectral_norm's pre-hook steps its power iteration in place at each call: not replayed; the Linear rule does
    not explain ``weight_orig``, and the first-step invariant refuses it by name."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.spectral_norm(nn.Linear(6, 6)), nn.Tanh(), nn.Linear(6, 3))
    with pytest.raises(UnsupportedLayerError, match=r"gradient of parameter 0\.weight_orig"):
        per_sample_grad_norms(model, ce, *_data())


def test_an_output_changed_in_place_after_the_call_is_still_replayed_exactly():
    """The replay is compared with the call's output as it was returned, not as later in-place operations left it."""
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.prelu, self.head = nn.PReLU(), nn.Linear(6, 3)

        def forward(self, x):
            h = self.prelu(x)
            h += 1.0
            return self.head(torch.relu_(h))

    model = InPlace()
    x, y = _data()
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)
