"""Sample independence (clbench.privacy.independence): models that mix the samples of a batch — BatchNorm in
training, F.batch_norm(training=True), z - z.mean(0) — refused with one line naming the operation and the module,
through per_sample_grad_norms and through the dp callback before any parameter moves; dropout (its randomness held
fixed) and per-sample models pass; buffers and the random stream are left as they were."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clbench.privacy import UnsupportedLayerError, per_sample_grad_norms
from tests.test_privacy import private_callback
from tests.test_privacy_rules import ce


class Mixing(nn.Module):
    def __init__(self, mix) -> None:
        super().__init__()
        self.mix, self.fc, self.head = mix, nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.mix(self.fc(x)))


def _data(b=6):
    g = torch.Generator().manual_seed(0)
    return torch.randn(b, 6, generator=g), torch.arange(b) % 3


@pytest.mark.parametrize("mix, named", [
    (lambda z: z - z.mean(0), "'mean' in the forward of Mixing at '<root>'"),
    (lambda z: F.batch_norm(z, None, None, training=True), "'batch_norm' in the forward of Mixing at '<root>'"),
], ids=["centering", "functional_batch_norm"])
def test_functional_mixing_is_refused_naming_the_operation(mix, named):
    x, y = _data()
    with pytest.raises(UnsupportedLayerError, match=f"per-sample gradients do not exist for this model: {named} "
                                                    f"mixes the samples of a batch"):
        per_sample_grad_norms(Mixing(mix), ce, x, y)


def test_batch_norm_module_is_refused_naming_it_and_its_buffers_are_restored():
    """The replays leave the running statistics as the model's own forward left them."""
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    twin = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    twin.load_state_dict(model.state_dict())
    x, y = _data()
    with pytest.raises(UnsupportedLayerError, match="'batch_norm' in the forward of BatchNorm1d at '1' mixes"):
        per_sample_grad_norms(model, ce, x, y)
    twin(x)
    assert all(torch.equal(v, twin.state_dict()[k]) for k, v in model.state_dict().items())


def test_the_first_private_step_refuses_a_mixing_model_before_it_trains():
    model = Mixing(lambda z: z - z.mean(0))
    x, y = _data()
    callback = private_callback(model)
    before = [p.detach().clone() for p in model.parameters()]
    callback.on_batch_start(x, y)
    loss = F.cross_entropy(model(x), y)
    callback.after_forward(loss)
    loss.backward()
    with pytest.raises(UnsupportedLayerError, match="'mean' in the forward of Mixing"):
        callback.after_backward(model)
    callback.close()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_dropout_is_held_fixed_and_the_random_stream_left_as_it_was():
    """A per-sample model with dropout passes (the replays draw the forward's masks), and the generator continues
    as if no replay had run."""
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5), nn.Linear(6, 3)).train()
    x, y = _data()
    torch.manual_seed(3)
    per_sample_grad_norms(model, ce, x, y)
    after_check = torch.rand(3)
    torch.manual_seed(3)
    model(x)
    assert torch.equal(torch.rand(3), after_check)


def test_the_replays_run_without_gradients_so_a_pattern_recorder_skips_them():
    """Other forward hooks see the check's two replays, but without gradients: the dual-form PatternRecorder's hook
    (like any hook that records training) records the training forward only."""
    from clbench.analysis.dual_form import _Layer

    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    grad_enabled = []
    model[0].register_forward_hook(lambda m, args, out: grad_enabled.append(torch.is_grad_enabled()))
    recorder = _Layer("0", model[0], lambda: None)
    per_sample_grad_norms(model, ce, *_data())
    assert grad_enabled == [True, False, False]          # the training forward, then the two replays
    assert len(recorder.calls) == 1 and recorder.calls[0]["g"] is not None
