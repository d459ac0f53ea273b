"""The private step (clbench.privacy.step) against a naive per-sample clip-and-sum, the accountant against opacus,
budget refusals, Poisson batches in the real loops, and a dp suite entry reaching the run record with its epsilon."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from torch import nn

from clbench import leaderboard
from clbench.callbacks import CallbackContext, CallbackList
from clbench.errors import ConfigError
from clbench.models.vit import vit
from clbench.privacy.accountant import PrivacyBudgetError, epsilon, noise_multiplier
from clbench.privacy.sampling import PoissonPlan
from clbench.privacy.step import DPConfig, PrivateTraining
from clbench.protocol import ClassificationInfo
from clbench.registry import STRATEGIES
from clbench.runner import execute
from clbench.suite_file import parse_suite
from clbench.tangent import linearize
from clbench.training import FitSettings, fit

INFO = ClassificationInfo(name="t", n_classes=4, classes_per_experience=(4,), input_shape=(3, 8, 8))


@pytest.fixture(autouse=True)
def _float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def tangent_model():
    torch.manual_seed(0)
    model = vit(INFO, embed_dim=16, depth=2, num_heads=2, patch_size=4, fused_attn=False)
    return linearize(model, last_blocks=1, linearize_cls=True).randomize_deltas(0.05, seed=3)


def per_sample_grads(model, x, y):
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(len(x)):
        out.append(torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params))
    return params, out


def private_callback(model, n=100, batch_size=8, **config):
    callback = PrivateTraining(**{"noise_multiplier": 1.0, "delta": 1e-5, **config})
    callback.setup(CallbackContext(run_id="unit", modules=lambda: {"model": model}, n_train=n))
    callback.batch_sampler(n, batch_size, epochs=1)
    return callback


@pytest.mark.parametrize("clipping", ["flat", "automatic"])
def test_clipped_sum_equals_naive_per_sample_clip_and_sum(clipping):
    """Noise off (σ = 0 after calibration): the book-kept gradient equals Σ_i C_i g_i / B̄ plus the ridge term that
    does not depend on the batch, with C_i from the naive per-sample gradients; batch 6 against expected 8."""
    model, clip, ridge = tangent_model(), 7.5, 0.3
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
    params, grads = per_sample_grads(model, x, y)
    norms = torch.stack([sum(t.square().sum() for t in gi).sqrt() for gi in grads])
    factors = (clip / (norms + 1e-6)).clamp(max=1) if clipping == "flat" else clip / (norms + 0.01)
    assert (norms > clip).any() and (norms < clip).any()            # some samples clipped, some not
    expected = [sum(factors[i] * grads[i][k] for i in range(6)) / 8 + 2 * ridge * p.detach()
                for k, p in enumerate(params)]

    callback = private_callback(model, clip=clip, clipping=clipping)
    callback.call.sigma = 0.0
    callback.on_batch_start(x, y)
    loss = F.cross_entropy(model(x), y) + ridge * sum(p.square().sum() for p in params)
    callback.after_forward(loss)                    # the first step's invariant sees the batch part of the loss
    loss.backward()
    callback.after_backward(model)
    for p, want in zip(params, expected):
        torch.testing.assert_close(p.grad, want, rtol=1e-9, atol=1e-12)


def test_noise_has_std_sigma_clip_over_expected_batch():
    torch.manual_seed(0)
    model = nn.Linear(200, 100)
    callback = private_callback(model, n=1000, batch_size=50, clip=2.0, noise_multiplier=1.5)
    x, y = torch.randn(40, 200), torch.randint(0, 100, (40,))
    callback.on_batch_start(x, y)
    F.cross_entropy(model(x), y).backward()
    before = {p: p.grad.clone() for p in model.parameters()}
    callback.call.sigma = 0.0
    callback.privatize(list(model.parameters()))
    clean = {p: p.grad.clone() for p in model.parameters()}
    for p in model.parameters():
        p.grad = before[p].clone()
    callback.call.sigma = 1.5
    callback.privatize(list(model.parameters()))
    noise = torch.cat([(p.grad - clean[p]).flatten() for p in model.parameters()])
    assert noise.std().item() == pytest.approx(1.5 * 2.0 / 50, rel=0.03)
    assert noise.mean().item() == pytest.approx(0.0, abs=0.01)


def test_accountant_matches_opacus():
    history = [(0.9, 0.01, 1000)]
    reference = RDPAccountant()
    for _ in range(1000):
        reference.step(noise_multiplier=0.9, sample_rate=0.01)
    assert epsilon(history, 1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    sigma = noise_multiplier(3.0, 1e-5, 0.01, 1000)
    assert sigma == get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.01, steps=1000)
    assert sigma == pytest.approx(0.8655, abs=1e-3)                  # STACK_NOTES: opacus gave 0.8655
    assert 2.98 < epsilon([(sigma, 0.01, 1000)], 1e-5) <= 3.0


@pytest.mark.parametrize("config, message", [
    ({"epsilon": 0.0}, "epsilon must be a finite number > 0"),
    ({"epsilon": -1.0}, "epsilon must be a finite number > 0"),
    ({"epsilon": 3.0, "delta": 1.0}, r"delta must lie in \(0, 1\)"),
    ({"epsilon": 3.0, "delta": 0.0}, r"delta must lie in \(0, 1\)"),
    ({"epsilon": 3.0, "clip": 0.0}, "clip .* must be > 0"),
    ({}, "give exactly one of epsilon"),
    ({"epsilon": 3.0, "noise_multiplier": 1.0}, "give exactly one of epsilon"),
    ({"epsilon": 3.0, "clipping": "adaptive"}, "clipping must be one of"),
])
def test_bad_budgets_are_refused(config, message):
    with pytest.raises(PrivacyBudgetError, match=message):
        DPConfig(**config)


def test_unreachable_epsilon_is_refused_before_the_first_step():
    callback = PrivateTraining(epsilon=1e-9, delta=1e-5)
    callback.setup(CallbackContext(modules=lambda: {"m": nn.Linear(2, 2)}, n_train=100))
    with pytest.raises(PrivacyBudgetError, match="no noise multiplier reaches epsilon=1e-09"):
        callback.batch_sampler(100, 10, 5)


def test_default_delta_is_one_over_n_and_needs_n():
    callback = PrivateTraining(epsilon=3.0)
    callback.setup(CallbackContext(n_train=250))
    assert callback.delta == 1 / 250
    with pytest.raises(PrivacyBudgetError, match="set dp.delta"):
        PrivateTraining(epsilon=3.0).setup(CallbackContext())


def test_loop_that_does_not_offer_its_batches_is_refused():
    callback = PrivateTraining(epsilon=3.0, delta=1e-5)
    callback.setup(CallbackContext(modules=lambda: {"m": nn.Linear(2, 2)}))
    with pytest.raises(RuntimeError, match="did not ask the callbacks for its minibatches"):
        callback.on_batch_start(torch.zeros(3, 2), torch.zeros(3))


def test_poisson_plan_draws_independent_batches_of_expected_size():
    plan = PoissonPlan.for_batch_size(1000, 50)
    assert (plan.sample_rate, plan.steps_per_epoch) == (0.05, 20)
    sizes = [len(b) for _ in range(20) for b in plan(torch.Generator().manual_seed(_))]
    assert len(set(sizes)) > 5
    assert sum(sizes) / len(sizes) == pytest.approx(50, rel=0.05)


def test_fit_trains_on_poisson_batches_with_private_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    seen = []

    class Sizes(PrivateTraining):
        def on_batch_start(self, x, y):
            seen.append(len(y))
            super().on_batch_start(x, y)

    callbacks = CallbackList()
    callbacks.callbacks.append(Sizes(epsilon=8.0, delta=1e-3))
    callbacks.callbacks[0].setup(CallbackContext(run_id="fit", modules=lambda: {"m": model}, n_train=200))
    x, y = torch.randn(200, 5), torch.randint(0, 3, (200,))
    steps = fit(model, model, model.parameters(), x, y, F.cross_entropy, FitSettings(2, 20, 0.01), 0, callbacks)
    call = callbacks.callbacks[0].call
    assert (call.steps, call.sample_rate, call.steps_taken) == (20, 0.1, steps)
    assert len(set(seen)) > 3 and steps == len(seen)
    assert callbacks.extra_metrics()["epsilon"] <= 8.0


# ---------------------------------------------------------------------------------------------- suite and runner
SCENARIO = {"name": "synthetic", "args": {"train_per_class": 30, "test_per_class": 10, "n_experiences": 2,
                                          "n_classes": 4}}


def suite(strategy):
    return parse_suite({"suite": "dp_test", "scenarios": [SCENARIO], "strategies": [strategy]})


@pytest.mark.parametrize("dp, message", [
    ({"epsilon": 0.0}, "epsilon must be a finite number > 0"),
    ({"epsilon": 3.0, "delta": 2.0}, r"delta must lie in \(0, 1\)"),
    ({"epsilon": 3.0, "clip": -1.0}, "must be > 0"),
    ({"epsilon": 3.0, "clipp": 1.0}, "unknown key 'clipp'"),
    ("3", "expected a mapping"),
])
def test_bad_dp_entries_are_refused_when_the_suite_loads(dp, message):
    with pytest.raises(ConfigError, match=message):
        suite({"name": "naive", "dp": dp})


def test_dp_on_a_replaying_strategy_is_refused():
    with pytest.raises(ConfigError, match="strategy 'replay' is not known to use each sample in one training call"):
        suite({"name": "replay", "dp": {"epsilon": 3.0}})


@pytest.mark.parametrize("entry, message", [
    ({"name": "replay", "callbacks": [{"name": "dp", "args": {"epsilon": 3.0}}]},
     "strategy 'replay' is not known to use each sample in one training call"),
    ({"name": "naive", "callbacks": [{"name": "dp", "args": {"epsilon": 0.0}}]}, "epsilon must be a finite number > 0"),
    ({"name": "naive", "dp": {"epsilon": 3.0}, "callbacks": [{"name": "dp", "args": {"epsilon": 3.0}}]},
     r"private training is given twice \(dp: and a dp callback\); keep one"),
], ids=["replay", "budget", "twice"])
def test_a_dp_callback_entry_is_checked_like_the_dp_key(entry, message):
    """`callbacks: [{name: dp}]` is no way around the strategy allow-list or the budget checks."""
    with pytest.raises(ConfigError, match=message):
        suite(entry)


def test_private_seqrec_composes_epsilon_over_the_periods_of_a_stream():
    """A user's items come back as history in later periods: seqrec on 3 periods declares its calls as sharing
    samples, so the run's ε is the composition of the 3 calls (within the budget, and above the largest single
    call's ε, which the per-call rule would have reported)."""
    from clbench.callbacks import CallbackSpec
    from tests.test_strategies_seqrec import cycles

    scenario = cycles(n_experiences=3, users=24, length=18)
    config = STRATEGIES.get("seqrec").Config(dim=8, epochs=1, batch_size=8)
    strategy = STRATEGIES.get("seqrec")(scenario.info, "cpu", config)
    n = sum(len(e.dataset) for e in scenario.train_stream)
    strategy.callbacks.attach([CallbackSpec("dp", {"epsilon": 4.0})], CallbackContext(run_id="stream", n_train=n,
                                                                                  modules=strategy.modules))
    for experience in scenario.train_stream:
        strategy.train(experience)
    (dp,) = strategy.callbacks.callbacks
    calls = dp.calls()
    assert dp.shared_calls == 3 and len(calls) == 3
    spent = dp.extra_metrics()["epsilon"]
    assert spent == epsilon([m for c in calls for m in c.history()], 1 / n)
    assert 3.9 < spent <= 4.0 and spent > max(epsilon(c.history(), 1 / n) for c in calls)


def test_private_shared_petl_refuses_a_rehearsal_memory():
    """Replayed samples train in several experiences: per-experience accounting would understate their ε; the
    exact line, before any training (without a memory the same strategy is private: the record test above)."""
    factory = STRATEGIES.get("lora")
    info = ClassificationInfo(name="b", n_classes=4, classes_per_experience=(2, 2), input_shape=(3, 8, 8))
    config = factory.Config(mem_size=10, model_args={"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 4})
    strategy = factory(info, torch.device("cpu"), config)
    strategy.callbacks.callbacks.append(PrivateTraining(epsilon=3.0))
    with pytest.raises(ValueError, match="^LoraSharedPETL: dp with a rehearsal memory \\(mem_size 10\\) is refused: "
                                         "replayed samples are trained on in several experiences, so the "
                                         "per-experience epsilon would understate theirs; set mem_size: 0.$"):
        strategy.train(None)


def test_dp_entry_is_part_of_the_run_identity():
    a = suite({"name": "naive", "dp": {"epsilon": 3.0}}).run_specs("cpu")[0]
    b = suite({"name": "naive", "dp": {"epsilon": 8.0}}).run_specs("cpu")[0]
    assert {"name": "dp", "args": {"epsilon": 3.0}} in a.strategy.callbacks
    assert a.identity() != b.identity()


@pytest.mark.parametrize("strategy", [
    {"name": "naive", "preset": "cpu", "args": {"epochs": 2, "batch_size": 16}},
    {"name": "taft", "preset": "cpu", "args": {"epochs": 2, "batch_size": 16, "loss": "ce", "model_args":
                                                {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}}},
    {"name": "nlft", "preset": "cpu", "args": {"epochs": 2, "batch_size": 16, "model_args":
                                                {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}}},
    {"name": "mam", "preset": "cpu", "args": {"epochs": 2, "batch_size": 16, "size": 2, "prefix_length": 3,
                                              "model_args": {"embed_dim": 16, "depth": 2, "num_heads": 2,
                                                             "patch_size": 4}}},
    {"name": "lora_merge", "preset": "cpu", "args": {"epochs": 2, "batch_size": 16, "size": 2, "placement": "both",
                                                     "model_args": {"embed_dim": 16, "depth": 2, "num_heads": 2,
                                                                    "patch_size": 4}}},
], ids=["naive", "taft", "nlft", "mam", "lora_merge"])
def test_dp_suite_entry_reaches_the_record_with_epsilon(strategy, tmp_path):
    torch.set_default_dtype(torch.float32)
    spec = suite({**strategy, "dp": {"epsilon": 3.0, "clip": 1.0}}).run_specs("cpu")[0]
    record = execute(spec, tmp_path)
    assert record.status == "finished", record.reason
    extra = record.metrics["extra"]
    # 60 training samples per experience, batch 16: q = 16/60, 2 epochs of 4 steps; delta = 1/120
    assert extra["delta"] == pytest.approx(1 / 120)
    sigma = noise_multiplier(3.0, 1 / 120, 16 / 60, 8)
    assert extra["noise_multiplier"] == pytest.approx(sigma)
    assert extra["epsilon"] == pytest.approx(epsilon([(sigma, 16 / 60, 8)], 1 / 120))
    assert 2.9 < extra["epsilon"] <= 3.0
    files = list((tmp_path / "artifacts" / spec.run_id / "privacy").glob("*.json"))
    calls = [c for f in files for c in json.loads(f.read_text())]
    assert len(calls) == 2 and all(c["steps"] == 8 and math.isclose(c["sigma"], sigma) for c in calls)
    assert all(0 < c["steps_taken"] <= 8 for c in calls)
    table = leaderboard.build([json.loads(record.to_json())])
    assert table["epsilon"][0] == pytest.approx(extra["epsilon"])
    assert "| epsilon |" in leaderboard.to_markdown(table)
