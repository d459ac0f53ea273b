"""The private step (:mod:`clbench.privacy.step`), the ``dp`` callback, fast (no training): δ = 1/n by default, each
training call calibrated at its rate and steps, the clipped and noised gradient against a naive per-sample clip-and-
sum with the exact seeded noise, the first-step invariant, and the ledger of training calls (files written per
member, read back, the run's ε the largest of its calls)."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clbench.callbacks import CallbackContext
from clbench.privacy import step
from clbench.privacy.accountant import epsilon, noise_multiplier
from clbench.privacy.reattention import ErrorPrior, ErrorTracking
from clbench.privacy.rules import UnsupportedLayerError
from clbench.privacy.sampling import PoissonPlan
from clbench.privacy.step import PrivateTraining, TrainingCall
from tests._dp_ledger import _ledger, exact, refused  # noqa: F401 - _ledger: an autouse fixture


# ------------------------------------------------------------------------------------------------ the dp callback
class Net(nn.Module):
    """A two-layer MLP in float64 with a frozen bias and a layer the forward never calls (its parameters get no
    gradient)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
        self.body[0].bias.requires_grad_(False)
        self.unused = nn.Linear(2, 2).double()

    def forward(self, x):
        return self.body(x)


def _callback(model, n_train=100, run_id="r", member="", artifacts=None, **config):
    callback = PrivateTraining(**{"noise_multiplier": 1.0, "delta": 1e-5, **config})
    callback.setup(CallbackContext(run_id=run_id, artifacts=artifacts, modules=lambda: {"m": model}, member=member,
                                   n_train=n_train))
    return callback


def _naive(model, x, y, clip, clipping, gamma):
    """Per-sample gradients by one backward per sample: their norms and the clipped sum Σ_i C_i g_i."""
    params = [p for p in model.parameters() if p.requires_grad and p is not model.unused.weight
              and p is not model.unused.bias]
    grads = [torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params) for i in range(len(x))]
    norms = torch.stack([torch.sqrt(sum(g.square().sum() for g in gi)) for gi in grads])
    factors = (clip / (norms + 1e-6)).clamp(max=1.0) if clipping == "flat" else clip / (norms + gamma)
    return params, norms, [sum(factors[i] * grads[i][k] for i in range(len(x))) for k in range(len(params))]


class Slipping(nn.Module):
    """An nn.Linear whose weight is used a second time in ``einsum`` outside its forward: its hooks fire and every
    parameter gets a gradient, but the rules explain half of the weight's gradient (only the first-step invariant
    sees it)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3).double()

    def forward(self, x):
        return self.lin(x) + torch.einsum("bi,oi->bo", x, self.lin.weight)


def _step(callback, model, x, y) -> None:
    """One training step as clbench.training.fit makes it: batch start, forward, after_forward, backward,
    after_backward."""
    model.zero_grad()
    callback.on_batch_start(x, y)
    loss = F.cross_entropy(model(x), y)
    callback.after_forward(loss)
    loss.backward()
    callback.after_backward(model)


XY = (torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), torch.tensor([0, 1, 2, 0, 1]))


def _call(sigma, q, steps, member="", **kw):
    return TrainingCall(n=100, batch_size=int(q * 100), epochs=1, sample_rate=q, steps=steps, sigma=sigma,
                        member=member, **kw)


# ------------------------------------------------------------------------------------------------ Re-Attention prior
class Tracking(nn.Module):
    """Implements :class:`ErrorTracking` (no parameters, no training): records every prior it is handed."""

    def __init__(self, prior: ErrorPrior | None) -> None:
        super().__init__()
        self.error_prior, self.given = prior, []

    def set_error_prior(self, prior: ErrorPrior | None) -> None:
        self.given.append(prior)
        self.error_prior = prior


def test_default_delta_is_one_over_the_stream_size_and_needs_it():
    """δ = 1/n (n the stream's training samples, 250 → 0.004); n unknown (< 2) without δ is refused with the exact
    line, a given δ needs no n; catches a changed default or a refusal of a given δ."""
    assert _callback(None, n_train=250, delta=None).delta == 1 / 250
    assert _callback(None, n_train=2, delta=None).delta == 0.5
    assert _callback(None, n_train=0, delta=1e-5).delta == 1e-5
    for n in (0, 1):
        with refused("dp: delta is not given and the run's number of training samples is unknown; set dp.delta."):
            _callback(None, n_train=n, delta=None)


def test_a_training_call_is_calibrated_to_the_budget_at_its_rate_and_steps():
    """ε = 2, δ = 1/50, n = 20, b = 5, 2 epochs: q = 0.25, 8 steps, σ = opacus's calibration for them; the call is
    in the run's ledger and the run reports ε ≤ 2 (within opacus's tolerance), σ and δ; catches a wrong rate, step
    count, δ or σ (the calibration itself is pinned against opacus by the accountant tests)."""
    callback = _callback(None, n_train=50, run_id="cal", delta=None, noise_multiplier=None, epsilon=2.0)
    callback.context.modules = lambda: {"m": nn.Linear(2, 2)}
    callback.batch_sampler(20, 5, 2)
    sigma = noise_multiplier(2.0, 0.02, 0.25, 8)            # opacus's calibration (pinned above), cached
    call = callback.call
    assert (call.n, call.batch_size, call.epochs, call.sample_rate, call.steps, call.sigma, call.member) == \
        (20, 5, 2, 0.25, 8, sigma, "")
    assert step.LEDGER == {"cal": {call.id: call}}
    extra = callback.extra_metrics()
    assert extra == {"epsilon": epsilon([(sigma, 0.25, 8)], 0.02), "noise_multiplier": sigma, "delta": 0.02}
    assert 1.98 < extra["epsilon"] <= 2.0


def test_a_given_noise_multiplier_is_used_as_is_and_batches_are_poisson_draws_from_the_loop_generator():
    """σ given: no calibration. The plan's epochs are PoissonPlan draws from the loop's generator, the first after
    one draw of ``randint(2**62)`` that seeds the noise stream once per callback (later epochs continue the stream
    and keep the noise generator); catches a different schedule, a re-seeded or unseeded noise stream."""
    callback = _callback(nn.Linear(2, 2).double(), member="shard1", noise_multiplier=1.3)
    plan = callback.batch_sampler(10, 4, 3)
    assert (callback.call.sample_rate, callback.call.steps, callback.call.sigma, callback.call.member) == \
        (0.4, 9, 1.3, "shard1")
    loop, mirror = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    seed = int(torch.randint(2**62, (), generator=mirror))
    reference = PoissonPlan(10, 0.4, 3)
    assert [b.tolist() for b in plan(loop)] == [b.tolist() for b in reference(mirror)]
    noise = callback.noise
    assert noise.initial_seed() == seed
    assert [b.tolist() for b in plan(loop)] == [b.tolist() for b in reference(mirror)]
    assert callback.noise is noise


@pytest.mark.parametrize("clipping, gamma", [("flat", 0.01), ("automatic", 0.3)])
def test_private_gradient_is_the_clipped_sum_plus_seeded_noise_over_the_expected_batch(clipping, gamma):
    """Batch of 6 at q = 0.5 of n = 16 (B̄ = 8), R = the median per-sample norm (some clipped, some not), σ = 1.3:
    each gradient becomes Σ_i C_i g_i / B̄ + (the loss's batch-independent ridge term) + σR/B̄ · z, z drawn from the
    noise stream seeded by the plan, parameter by parameter; the frozen and the uncalled parameters are left alone,
    the per-sample norms are returned and the step is counted; catches any wrong factor in the clipped sum, the
    noise scale or stream, the clipping rule or γ, or a dropped parameter filter."""
    model, ridge, sigma = Net(), 0.2, 1.3
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)
    probe = _naive(model, x, y, 1.0, clipping, gamma)[1]
    clip = float(probe.median())
    params, norms, clipped = _naive(model, x, y, clip, clipping, gamma)
    assert (norms > clip + 1e-3).any() and (norms < clip - 1e-3).any()

    callback = _callback(model, clip=clip, clipping=clipping, gamma=gamma, noise_multiplier=sigma)
    plan = callback.batch_sampler(16, 8, 1)
    loop, mirror = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    list(plan(loop))
    noise = torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=mirror)))
    model.zero_grad()
    callback.on_batch_start(x, y)
    loss = F.cross_entropy(model(x), y) + ridge * sum(p.square().sum() for p in params)
    callback.after_forward(loss)                    # the first step's invariant sees the batch part of the loss
    loss.backward()
    got = callback.privatize([p for p in model.parameters() if p.requires_grad and p.grad is not None])
    for p, summed in zip(params, clipped):
        z = torch.randn(p.shape, generator=noise, dtype=torch.float64)
        torch.testing.assert_close(p.grad, summed / 8 + 2 * ridge * p.detach() + sigma * clip / 8 * z,
                                   rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got, norms, rtol=1e-9, atol=1e-12)
    assert model.body[0].bias.grad is None and model.unused.weight.grad is None
    assert callback.call.steps_taken == 1


def test_after_backward_privatizes_only_parameters_with_a_gradient():
    """The hook passes the trainable parameters that received a gradient (an uncalled layer's would be refused as
    unexplained): after a step every such gradient has changed; each step is counted (2 after two) with its batch
    size; catches a dropped filter or a step count that does not accumulate."""
    model = Net()
    callback = _callback(model, noise_multiplier=0.5)
    list(callback.batch_sampler(16, 8, 1)(torch.Generator().manual_seed(0)))
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    callback.on_batch_start(x, y)
    F.cross_entropy(model(x), y).backward()
    before = [p.grad.clone() for p in model.body.parameters() if p.grad is not None]
    callback.after_backward(model)
    after = [p.grad for p in model.body.parameters() if p.grad is not None]
    assert len(after) == 3 and all(not torch.equal(a, b) for a, b in zip(after, before))
    assert callback.call.steps_taken == 1 and callback.batch == 5
    model.zero_grad()
    callback.on_batch_start(x[:3], y[:3])
    F.cross_entropy(model(x[:3]), y[:3]).backward()
    callback.after_backward(model)
    assert callback.call.steps_taken == 2 and callback.batch == 3


def test_a_parameter_the_rules_leave_out_isrefused(monkeypatch):
    """A rule that gives no per-sample gradient for a parameter: the exact line with the shapes (the parameter
    would be updated without clipping or noise)."""
    model = nn.Linear(3, 2).double()
    callback = _callback(model)
    list(callback.batch_sampler(16, 8, 1)(torch.Generator().manual_seed(0)))
    x = torch.randn(4, 3, dtype=torch.float64)
    callback.on_batch_start(x, torch.zeros(4))
    model(x).sum().backward()
    monkeypatch.setattr(callback.tape, "weighted_grads", lambda w: {})
    callback.unchecked = False                      # past the first step (whose invariant refuses it first)
    with pytest.raises(UnsupportedLayerError, match=re.escape(
            "dp: the layer rules gave no per-sample gradient for parameters of shapes [(2, 3), (2,)]; they would be "
            "updated without clipping or noise.")):
        callback.after_backward(model)


def test_a_loop_that_does_not_ask_for_its_batches_isrefused():
    """on_batch_start before any batch_sampler call: the exact line naming the loops that do ask."""
    callback = _callback(nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match=exact(
            "dp: this training loop did not ask the callbacks for its minibatches (Callback.batch_sampler), so it "
            "cannot draw Poisson batches; use clbench.training.fit or an Avalanche template bridged with "
            "clbench.callbacks.bridge.")):
        callback.on_batch_start(torch.zeros(3, 2), torch.zeros(3))


def test_each_training_calls_first_step_refuses_a_gradient_the_rules_do_not_explain():
    """The einsum use of a Linear's weight: the first step of a call stops in after_backward with the exact line
    naming the parameter, the share unaccounted and the use, before any parameter moves; so does the first step of
    the next call (the check is re-armed by batch_sampler); catches a check that is never armed."""
    model = Slipping()
    callback = _callback(model)
    before = [p.detach().clone() for p in model.parameters()]
    line = ("per-sample gradient norms: the layer rules explain only part of the gradient of parameter lin.weight "
            "(50.0% of it unaccounted: its use in einsum outside its layer's forward); its per-sample norms would be "
            "wrong, so private training stops here: freeze it, write the use as a layer, or add a rule with "
            "clbench.privacy.register_rule.")
    for _ in range(2):
        callback.batch_sampler(16, 8, 1)
        with pytest.raises(UnsupportedLayerError, match=exact(line)):
            _step(callback, model, *XY)
        assert callback.call.steps_taken == 0
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    callback.close()


def test_the_invariant_runs_on_a_calls_first_step_only(monkeypatch):
    """Three steps of one call, then two of the next: autograd's batch gradient and the invariant are computed once
    per call (at its first step); after it the tape keeps no more outputs (a later step's forward leaves none
    behind); catches a check run at every step, a batch gradient taken at every step, outputs kept past the first
    step."""
    from clbench.privacy.tape import Tape

    seen = []
    explain, batch_gradient = Tape.explain, Tape.batch_gradient
    monkeypatch.setattr(Tape, "explain", lambda self, *a: (seen.append("explain"), explain(self, *a))[1])
    monkeypatch.setattr(Tape, "batch_gradient",
                        lambda self, loss: (seen.append("gradient"), batch_gradient(self, loss))[1])
    model = Net()
    callback = _callback(model)
    for steps in (3, 2):
        callback.batch_sampler(16, 8, 1)
        assert callback.unchecked is True and callback.tape.keep_outputs is True
        for i in range(steps):
            _step(callback, model, *XY)
            assert (callback.unchecked, callback.reference, callback.tape.keep_outputs, callback.tape.outputs) == \
                (False, None, False, []), i
        assert callback.call.steps_taken == steps
    assert seen == ["gradient", "explain", "gradient", "explain"]
    callback.close()


def test_a_first_step_of_one_sample_keeps_the_checks_armed_for_the_next_step(monkeypatch):
    """A call's first step draws one sample (sample independence cannot be tested on it): the invariant runs, and
    the callback stays armed with the outputs kept, so the next step (of five) runs both checks again and only then
    disarms; catches the checks disarmed after a batch too small to test them."""
    from clbench.privacy.tape import Tape

    seen = []
    explain = Tape.explain
    monkeypatch.setattr(Tape, "explain", lambda self, *a: (seen.append("explain"), explain(self, *a))[1])
    model = Net()
    callback = _callback(model)
    callback.batch_sampler(16, 8, 1)
    _step(callback, model, XY[0][:1], XY[1][:1])
    assert (callback.unchecked, callback.reference, callback.tape.keep_outputs, seen) == (True, None, True,
                                                                                          ["explain"])
    _step(callback, model, *XY)
    assert (callback.unchecked, callback.reference, callback.tape.keep_outputs, callback.tape.outputs, seen) == \
        (False, None, False, [], ["explain", "explain"])
    assert callback.call.steps_taken == 2
    callback.close()


def test_a_forward_without_gradient_before_the_first_step_leaves_the_invariant_to_the_step():
    """A forward under no_grad at a call's first step (e.g. a teacher's logits) whose loss needs no gradient:
    after_forward takes no batch gradient of it and the invariant stays armed, with the outputs still kept, for the
    step's own loss; catches after_forward differentiating a loss without a graph."""
    model = Net()
    callback = _callback(model)
    callback.batch_sampler(16, 8, 1)
    callback.on_batch_start(*XY)
    with torch.no_grad():
        callback.after_forward(F.cross_entropy(model(XY[0]), XY[1]))
    assert (callback.unchecked, callback.reference, callback.tape.keep_outputs) == (True, None, True)
    _step(callback, model, *XY)
    assert (callback.unchecked, callback.call.steps_taken) == (False, 1)
    callback.close()


def test_each_training_call_hooks_the_current_modules_and_closing_unhooks():
    """A new training call replaces the tape (the old one's hooks removed, the modules of now hooked); on_batch_start
    forgets the last batch's records; close removes the hooks; catches hooks left behind (they would record every
    later forward)."""
    model = nn.Linear(3, 2).double()
    callback = _callback(model)
    callback.batch_sampler(16, 8, 1)
    first = callback.tape
    x = torch.randn(4, 3, dtype=torch.float64)
    model(x)
    assert list(first.calls) == [model]
    callback.batch_sampler(16, 8, 1)
    assert callback.tape is not first and first.handles == [] and callback.tape.handles
    callback.on_batch_start(x, torch.zeros(4))
    assert callback.tape.calls == {}
    second = callback.tape
    callback.close()
    model(x)
    assert callback.tape is None and second.handles == [] and second.calls == {}


def test_the_run_process_starts_a_fresh_ledger_and_members_keep_it(tmp_path):
    """setup in the run's own process empties the run's ledger and deletes its stale call files (``*.json`` only);
    a member's setup (another process's share of the same run) touches neither."""
    folder = tmp_path / "privacy"
    folder.mkdir()
    (folder / "old.json").write_text("[]")
    (folder / "notes.txt").write_text("kept")
    step.LEDGER["r"] = {"x": "stale"}
    _callback(None, member="shard0", artifacts=tmp_path)
    assert step.LEDGER["r"] == {"x": "stale"} and (folder / "old.json").exists()
    _callback(None, artifacts=tmp_path)
    assert step.LEDGER["r"] == {} and sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    _callback(None, run_id="other")                     # no artifacts folder: nothing to delete
    assert step.LEDGER["other"] == {}


def test_close_writes_this_process_calls_per_member_and_the_run_reads_them_back(tmp_path):
    """A member writes only its own calls to ``privacy/<member>-<8 hex>.json`` (the run's process to ``run-...``);
    the run's process reads the files back, keeping its own record of a call it holds; ε is the largest per-call
    ε (disjoint data) at the run's δ, σ the largest σ; a member reports nothing; catches calls lost between
    processes, double counting or min for max."""
    artifacts = tmp_path / "artifacts" / "r"                # created by the first writer, parents included
    run = _callback(None, artifacts=artifacts, delta=1e-3)
    member = _callback(None, artifacts=artifacts, member="shard0", delta=1e-3)
    mine, theirs = _call(2.0, 0.1, 30, steps_taken=30), _call(0.8, 0.05, 40, member="shard0", steps_taken=40)
    step.LEDGER["r"].update({mine.id: mine, theirs.id: theirs})
    member.close()
    (written,) = (artifacts / "privacy").iterdir()
    assert re.fullmatch(r"shard0-[0-9a-f]{8}\.json", written.name)
    assert json.loads(written.read_text()) == [{"n": 100, "batch_size": 5, "epochs": 1, "sample_rate": 0.05,
                                                "steps": 40, "sigma": 0.8, "member": "shard0", "steps_taken": 40,
                                                "releases": [], "id": theirs.id}]
    assert member.extra_metrics() == {}
    run.close()
    names = sorted(p.name.split("-")[0] for p in (artifacts / "privacy").iterdir())
    assert names == ["run", "shard0"]

    step.LEDGER["r"] = {mine.id: mine}                   # the run's process did not see the member's call
    calls = run.calls()
    assert calls[0] is mine and calls[1] == theirs and len(calls) == 2
    spent = [epsilon([(2.0, 0.1, 30)], 1e-3), epsilon([(0.8, 0.05, 40)], 1e-3)]
    assert spent[0] != spent[1]
    assert run.extra_metrics() == {"epsilon": max(spent), "noise_multiplier": 2.0, "delta": 1e-3}


def test_a_released_statistic_is_gaussian_noise_on_it_and_composed_into_the_next_call(tmp_path):
    """release(values, Δ = 2, σ_f = 3) returns values + 6·z, z from torch's global generator; the next call is
    calibrated for ε = 2 with the release composed, records it (and no longer holds it as pending), writes it to
    its file and reads it back, and the run's ε is the composition's; catches noise of another scale, a release left
    out of σ, of the record, of the file or of ε."""
    callback = _callback(None, n_train=50, artifacts=tmp_path, delta=None, noise_multiplier=None, epsilon=2.0)
    callback.context.modules = lambda: {"m": nn.Linear(2, 2)}
    values = torch.arange(6.0, dtype=torch.float64)
    torch.manual_seed(4)
    z = torch.randn(6, dtype=torch.float64)
    torch.manual_seed(4)
    torch.testing.assert_close(callback.release(values, 2.0, 3.0), values + 6.0 * z, rtol=0, atol=0)
    callback.batch_sampler(20, 5, 2)
    sigma = noise_multiplier(2.0, 0.02, 0.25, 8, ((3.0, 1.0, 1),))
    assert sigma > noise_multiplier(2.0, 0.02, 0.25, 8)
    assert (callback.call.sigma, callback.call.releases, callback.releases) == (sigma, [(3.0, 1.0, 1)], [])
    spent = epsilon([(sigma, 0.25, 8), (3.0, 1.0, 1)], 0.02)
    assert 1.99 <= spent <= 2.0 and callback.extra_metrics()["epsilon"] == spent
    callback.close()
    step.LEDGER["r"] = {}
    (read,) = callback.calls()
    assert read.history() == [(sigma, 0.25, 8), (3.0, 1.0, 1)]
    assert callback.extra_metrics()["epsilon"] == spent


@pytest.mark.parametrize("sensitivity, noise, message", [
    (0.0, 1.0, "dp: a released statistic needs a finite sensitivity > 0, got 0.0."),
    (math.inf, 1.0, "dp: a released statistic needs a finite sensitivity > 0, got inf."),
    (1.0, 0.0, "dp: a released statistic needs a finite noise multiplier > 0, got 0.0."),
    (1.0, math.nan, "dp: a released statistic needs a finite noise multiplier > 0, got nan."),
])
def test_a_release_with_a_bad_sensitivity_or_noise_is_refused_and_records_nothing(sensitivity, noise, message):
    callback = _callback(None)
    with refused(message):
        callback.release(torch.zeros(2), sensitivity, noise)
    assert callback.releases == []


def test_a_release_without_a_training_call_after_it_blocks_the_run_epsilon():
    """A statistic released but never followed by a call would be left out of ε: the exact line instead."""
    callback = _callback(None)
    step.LEDGER["r"] = {(call := _call(1.0, 0.1, 10)).id: call}
    callback.release(torch.zeros(2), 1.0, 1.0)
    with pytest.raises(RuntimeError, match=exact("dp: 1 statistic(s) were released without a training call after "
                                                  "them, so the run's epsilon would leave them out.")):
        callback.extra_metrics()


def test_calls_that_share_samples_are_calibrated_and_reported_as_one_composition():
    """share_samples(3), ε = 2, three calls of q = 0.25 and 8 steps: call 1 is calibrated for all 24 steps, call 2
    for its 16 with call 1 composed, call 3 for its 8 with both; the run's ε is the composition of the three (within
    0.01 below the budget), not the largest call's; catches a call left out of the calibration or of ε, or later
    calls not reserved for."""
    callback = _callback(None, n_train=50, delta=None, noise_multiplier=None, epsilon=2.0)
    callback.context.modules = lambda: {"m": nn.Linear(2, 2)}
    callback.share_samples(3)
    sigmas = []
    for later in (2, 1, 0):
        applied = tuple((s, 0.25, 8) for s in sigmas)
        callback.batch_sampler(20, 5, 2)
        assert callback.call.sigma == noise_multiplier(2.0, 0.02, 0.25, 8 * (1 + later), applied)
        sigmas.append(callback.call.sigma)
    spent = epsilon([(s, 0.25, 8) for s in sigmas], 0.02)
    assert 1.99 <= spent <= 2.0 and callback.extra_metrics()["epsilon"] == spent
    assert max(epsilon([(s, 0.25, 8)], 0.02) for s in sigmas) < 1.5
    with pytest.raises(ValueError, match=exact("dp: share_samples needs the number of training calls (>= 1), "
                                                "got 0.")):
        callback.share_samples(0)
    callback.share_samples(1)
    assert callback.shared_calls == 1


def test_calls_on_disjoint_data_are_each_calibrated_alone_and_epsilon_is_the_largest():
    """Without share_samples, a second call is calibrated as if alone (the first is not composed in) and the run's
    ε is the larger of the two; catches earlier calls composed into a disjoint-data run."""
    callback = _callback(None, n_train=50, delta=None, noise_multiplier=None, epsilon=2.0)
    callback.context.modules = lambda: {"m": nn.Linear(2, 2)}
    callback.batch_sampler(20, 5, 2)
    callback.batch_sampler(40, 5, 1)
    first, second = sorted(callback.calls(), key=lambda c: c.n)
    assert first.sigma == noise_multiplier(2.0, 0.02, 0.25, 8)
    assert second.sigma == noise_multiplier(2.0, 0.02, 0.125, 8)
    assert callback.extra_metrics()["epsilon"] == max(epsilon(c.history(), 0.02) for c in (first, second))


def test_close_without_a_folder_or_calls_writes_nothing(tmp_path):
    """No artifacts folder: calls stay in memory only (no error); no calls: no file and no empty folder."""
    callback = _callback(None, delta=1e-3)
    call = _call(1.0, 0.1, 10)
    step.LEDGER["r"][call.id] = call
    callback.close()
    assert callback.calls() == [call]
    empty = _callback(None, run_id="e", artifacts=tmp_path)
    empty.close()
    assert list(tmp_path.iterdir()) == []


def test_a_run_without_any_private_call_cannot_report_epsilon(tmp_path):
    """No training call recorded (the loop never asked for batches): the exact line instead of ε = 0."""
    callback = _callback(None, artifacts=tmp_path)
    with pytest.raises(RuntimeError, match=exact("dp: no private training call was recorded for this run, so no "
                                                  "epsilon can be reported.")):
        callback.extra_metrics()


def test_a_member_process_without_calls_closes_and_reads_the_run_files_without_a_ledger_entry(tmp_path):
    """A member's setup creates no ledger entry for the run (only the run's process does); if it made no private
    call, close writes nothing and calls() returns what the files hold (nothing, then the one call another member
    wrote), without touching the ledger; catches a missing default for a run absent from this process's ledger
    (close and calls would fail with AttributeError/TypeError)."""
    member = _callback(None, member="shard1", artifacts=tmp_path)
    assert step.LEDGER == {}
    member.close()
    assert list(tmp_path.iterdir()) == [] and member.calls() == []
    other = _call(0.8, 0.05, 40, member="shard0")
    (tmp_path / "privacy").mkdir()
    (tmp_path / "privacy" / "shard0-00000000.json").write_text(json.dumps([dataclasses.asdict(other)]))
    assert member.calls() == [other] and step.LEDGER == {}


def test_before_any_training_call_the_callback_holds_no_call_and_no_batch():
    """A fresh callback's state says "no call yet": ``call`` is None (not a falsy placeholder such as "") and the
    last batch size is 0; catches a non-None initial call or a batch size other than 0."""
    callback = PrivateTraining(noise_multiplier=1.0)
    assert callback.call is None and callback.batch == 0 and callback.tape is None and callback.noise is None


def test_each_training_call_hands_its_noise_to_every_module_holding_an_error_prior():
    """σ = 1.3, R = 2.5, n = 10, b = 4 (q = 0.4, B̄ = q·n = 4.0, where q/n = 0.04 and n = 10): each module holding a
    prior, nested in either of the strategy's modules, gets a prior with σ_dp = the call's σ, clip = R and
    batch_size = B̄, its token frequencies (the same tensor) and scale kept; a second call (n = 25, b = 5: B̄ = 5.0)
    updates it again from the current prior; a module whose prior is None is never handed one; catches a dropped,
    swapped or None argument of with_noise, q/n for q·n, a prior replaced by None or a None module skipped.
    The dense σ_eff² = (scale·σR/B̄)² = (0.5·1.3·2.5/4)² follows by hand."""
    frequency = torch.tensor([0.5, 0.0, 0.25])
    nested = Tracking(ErrorPrior(sigma_dp=0.0, batch_size=64.0, token_frequency=frequency, scale=0.5, clip=1.0))
    plain = Tracking(ErrorPrior(sigma_dp=0.7, batch_size=3.0))
    untracked = Tracking(None)
    assert isinstance(nested, ErrorTracking) and isinstance(untracked, ErrorTracking)
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nested, untracked))
    callback = _callback(None, clip=2.5, noise_multiplier=1.3)
    callback.context.modules = lambda: {"model": model, "head": plain}
    callback.batch_sampler(10, 4, 2)
    for module, frequencies, scale in [(nested, frequency, 0.5), (plain, None, 1.0)]:
        (prior,) = module.given
        assert prior is module.error_prior and type(prior) is ErrorPrior
        assert (prior.sigma_dp, prior.clip, prior.batch_size, prior.scale) == (1.3, 2.5, 4.0, scale)
        assert prior.token_frequency is frequencies
    assert nested.error_prior.dense_var == pytest.approx((0.5 * 1.3 * 2.5 / 4) ** 2, rel=1e-12)
    assert untracked.given == [] and untracked.error_prior is None
    callback.batch_sampler(25, 5, 1)
    assert [p.batch_size for p in nested.given] == [4.0, 5.0] and nested.error_prior.token_frequency is frequency
    assert (nested.error_prior.sigma_dp, nested.error_prior.clip, nested.error_prior.scale) == (1.3, 2.5, 0.5)
    assert untracked.given == []
