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
from tests.test_privacy_norms import RTOL, ce, vmap_norms

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
