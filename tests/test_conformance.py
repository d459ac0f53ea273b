"""Conformance over every registry, as timm tests every name of ``list_models()``: each strategy preset builds its
Config (each strategy x preset trains two tiny experiences in tests/test_contract.py), each model builds and trains
one step, each scenario builds with its smallest arguments where its data exist (skipped with the reason where real
data are missing), each callback rides the one training loop, each rehearsal memory keeps its budget. A new entry is
picked up without editing this file; a callback whose arguments have no usable defaults names them in
``CALLBACK_ARGS`` (a new one without is reported by name)."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from torch import nn

from clbench.callbacks import Callback, CallbackContext, CallbackList, CallbackSpec
from clbench.cl import MEMORIES, build_memory
from clbench.config import build_config
from clbench.data.errors import DatasetNotFound
from clbench.protocol import CLASSIFICATION, NEXT_ITEM, ClassificationInfo, Scenario, scenario_kind
from clbench.registry import CALLBACKS, MODELS, SCENARIOS, STRATEGIES
from clbench.scenarios.movielens import sequences_scenario
from clbench.training import FitSettings, fit


def shipped(registry) -> list[str]:
    """The names registered by clbench's own modules (not by a test or an outside plugin)."""
    return [n for n in registry.names() if registry.get(n).__module__.startswith("clbench.")]


def synthetic() -> Scenario:
    return SCENARIOS.get("synthetic")(seed=0, n_classes=4, n_experiences=2, train_per_class=3, test_per_class=2)


NEXT_ITEM_ROWS = np.array([(u, (u + t) % 8 + 1, 1, 100 * t + u) for u in range(6) for t in range(8)])
TINY_SCENARIOS = {CLASSIFICATION: synthetic,
                  NEXT_ITEM: lambda: sequences_scenario(NEXT_ITEM_ROWS, 2, max_len=4, n_items=8)}
"""A tiny scenario of each kind; a model gets the one of the kind it declares (:func:`scenario_kind`)."""


# --------------------------------------------------------------------------------------------------- strategies
PRESETS = [(n, p) for n in shipped(STRATEGIES) for p in STRATEGIES.get(n).PRESETS]


@pytest.mark.parametrize("name, preset", PRESETS)
def test_every_strategy_preset_builds_its_config(name, preset):
    """Every preset's values are fields of the strategy's Config and pass its checks (training every strategy x
    preset on a tiny scenario: tests/test_contract.py)."""
    config = build_config(name, preset, {})
    assert isinstance(config, STRATEGIES.get(name).Config)


# ------------------------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("name", shipped(MODELS))
def test_every_model_builds_and_trains_one_step(name):
    torch.manual_seed(0)
    scenario = TINY_SCENARIOS[scenario_kind(MODELS.get(name))]()
    model = MODELS.get(name)(scenario.info)
    if hasattr(model, "add_task"):                       # a growing model starts with its first task
        model.add_task(scenario.info.classes_per_experience[0])
    dataset = scenario.train_stream[0].dataset
    x = torch.stack([torch.as_tensor(dataset[i][0]) for i in range(3)])
    out = model(x)
    scores = getattr(out, "logits", out)
    assert isinstance(scores, torch.Tensor) and scores.shape[0] == 3 and torch.isfinite(scores).all()
    scores.float().pow(2).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(bool(g.abs().sum() > 0) for g in grads)


# ---------------------------------------------------------------------------------------------------- scenarios
SMALLEST = {"max_per_class": 2, "train_per_class": 2, "test_per_class": 2}
"""The smallest size of every size argument a scenario may take (each scenario gets those in its signature)."""


@pytest.mark.parametrize("name", shipped(SCENARIOS))
def test_every_scenario_builds_with_its_smallest_arguments(name):
    factory = SCENARIOS.get(name)
    args = {k: v for k, v in SMALLEST.items() if k in inspect.signature(factory).parameters}
    try:
        scenario = factory(seed=0, **args)
    except DatasetNotFound as exc:
        pytest.skip(f"{name}: real data missing ({str(exc).splitlines()[0]})")
    assert isinstance(scenario, Scenario) and callable(scenario.evaluator)
    assert len(scenario.train_stream) == len(scenario.test_stream) >= 1
    for t, experience in enumerate(scenario.train_stream):
        assert experience.current_experience == t and len(experience.dataset) > 0
    info = scenario.info
    if isinstance(info, ClassificationInfo):
        assert len(info.classes_per_experience) == len(scenario.train_stream)
        assert sum(info.classes_per_experience) == info.n_classes
        for t, experience in enumerate(scenario.train_stream):
            assert set(experience.dataset.targets) <= set(info.class_range(t)), (name, t)


# ---------------------------------------------------------------------------------------------------- callbacks
CALLBACK_ARGS = {"dp": {"noise_multiplier": 1.0}, "dual_form": {"layers": ["model.fc"]}}
"""Arguments of callbacks that have no usable defaults (the test's model is ``{"model": Sequential(fc=Linear)}``)."""


@pytest.mark.parametrize("name", shipped(CALLBACKS))
def test_every_callback_rides_the_training_loop(name, tmp_path):
    model = nn.Sequential()
    model.add_module("fc", nn.Linear(4, 3))
    context = CallbackContext(run_id="conformance", artifacts=tmp_path, modules=lambda: {"model": model}, n_train=16)
    try:
        callbacks = CallbackList.build([CallbackSpec(name, CALLBACK_ARGS.get(name, {}))], context)
    except (TypeError, ValueError) as exc:
        pytest.fail(f"callback {name!r} does not build with {CALLBACK_ARGS.get(name, {})}: {exc}; give it "
                    f"arguments in CALLBACK_ARGS")
    assert all(isinstance(c, Callback) for c in callbacks.callbacks)
    before = [p.detach().clone() for p in model.parameters()]
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=generator), torch.randint(0, 3, (16,), generator=generator)
    callbacks.on_experience_start(0)
    steps = fit(model, model, model.parameters(), x, y, nn.functional.cross_entropy,
                FitSettings(2, 4, 0.1, optimizer="sgd"), 0, callbacks)
    callbacks.on_experience_end(0)
    callbacks.close()
    assert steps >= 1 and any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    extra = callbacks.extra_metrics()
    assert isinstance(extra, dict) and all(isinstance(v, float) and math.isfinite(v) for v in extra.values())


def test_a_non_finite_loss_stops_the_loop_whatever_callback_is_attached(registered):
    class Quiet(Callback):
        pass

    registered(CALLBACKS, "test_quiet", Quiet)
    callbacks = CallbackList.build([CallbackSpec("test_quiet")], CallbackContext())
    model = nn.Linear(2, 1)
    with pytest.raises(Exception, match="non-finite value"):
        fit(model, model, model.parameters(), torch.ones(2, 2), torch.zeros(2, 1),
            lambda out, y: out.sum() * float("nan"), FitSettings(1, 2, 0.1), 0, callbacks)


def test_the_registered_fixture_takes_its_entries_back():
    assert "test_quiet" not in CALLBACKS.names()


# ----------------------------------------------------------------------------------------------------- memories
@pytest.mark.parametrize("kind", MEMORIES.names())
def test_every_memory_keeps_its_budget(kind):
    memory = build_memory(kind, 5)
    experience = synthetic().train_stream[0]
    memory.update(experience.dataset, lambda ds: torch.randn(len(ds), 3, generator=torch.Generator().manual_seed(0)))
    assert 0 < len(memory) <= 5


def test_the_parametrizations_cover_every_registry_entry():
    """The lists above are read from the registries (nothing hand-listed); strategies x presets are
    tests/test_contract.py's."""
    assert {"dytox", "seqrec", "vit", "mlp"} <= set(shipped(MODELS))
    assert len(shipped(CALLBACKS)) >= 6 and {"dp", "hook_trace"} <= set(shipped(CALLBACKS))
    assert {"synthetic", "split_digits"} <= set(shipped(SCENARIOS))
    assert len(shipped(STRATEGIES)) >= 16
