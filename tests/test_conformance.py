"""Conformance over every registry, as timm tests every name of ``list_models()``: each strategy preset builds its
Config (and each strategy x preset trains two tiny experiences, below), each model builds and trains
one step, each scenario builds with its smallest arguments where its data exist (skipped with the reason where real
data are missing), each callback rides the one training loop, each rehearsal memory keeps its budget. A new entry is
picked up without editing this file; a callback whose arguments have no usable defaults names them in
``CALLBACK_ARGS`` (a new one without is reported by name).

The written strategy contract: every registered strategy x preset builds, trains two experiences, predicts finite
scores of the right shape and reports consistent parameter counts (timm's registry-wide style); a class that breaks
the contract is refused when it registers (tests/test_registry.py), a wrong return value fails the run with a
message naming the strategy (tests/test_runner.py).

Every Config field of every shipped strategy is a setting that counts: changed to a valid other value, it changes
the run identity (resume reruns, the leaderboard separates the rows) AND either what is trained (the predictions
or parameter counts after two tiny experiences) or it is listed, with the reason, in
:data:`clbench.config.NOT_TRAINING`. A field that changes neither is a value the user can set and that is silently
ignored (issue #26: LoRA's ``placement: ffn``).

The other value is found automatically from the field's type, current value and declaration (half or the next
integer, twice the float, the negated bool, another of its declared choices...) or taken from :data:`OTHER_VALUES`;
up to three values that the configuration accepts and that train are tried, and one changed result is enough (an
alias of the default, ``model: mlp`` for ``auto``, changes nothing and is not a defect). A field whose every other
value is refused at load is fine (``momentum`` under Adam: declared used only with ``optimizer: sgd``). A field
declared used only with another setting is changed on top of that setting's declared example; :data:`CONTEXT` gives
what else a field needs to act at this scale, :data:`SAME_HERE` the fields that train the same on this tiny balanced
data and why, :data:`OPEN` the ignored settings found in files owned elsewhere and being fixed there. About 2 minutes
with ``-n 2`` on the quiet 2-core VM (7-17 minutes when loaded); one strategy:
``pytest tests/test_conformance.py -k "every_config_field and lwf"``."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing

import numpy as np
import pytest
import torch
from torch import nn

from clbench.callbacks import Callback, CallbackContext, CallbackList, CallbackSpec
from clbench.cl import MEMORIES, build_memory
from clbench.config import NOT_TRAINING, build_config, config_hash
from clbench.data.errors import DatasetNotFound
from clbench.errors import ConfigError
from clbench.protocol import (
    CLASSIFICATION,
    NEXT_ITEM,
    ClassificationInfo,
    ParamCount,
    Scenario,
    StrategyBase,
    hooks_checked,
    scenario_kind,
)
from clbench.registry import CALLBACKS, MODELS, SCENARIOS, STRATEGIES
from clbench.runner import seed_everything
from clbench.scenarios.movielens import sequences_scenario
from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry
from clbench.training import FitSettings, fit
from clbench.typecheck import declarations


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
    preset on a tiny scenario: test_every_strategy_and_preset_trains_two_experiences_and_predicts, below)."""
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
    test_every_strategy_and_preset_trains_two_experiences_and_predicts's, below."""
    assert {"dytox", "seqrec", "vit", "mlp"} <= set(shipped(MODELS))
    assert len(shipped(CALLBACKS)) >= 6 and {"dp", "hook_trace"} <= set(shipped(CALLBACKS))
    assert {"synthetic", "split_digits"} <= set(shipped(SCENARIOS))
    assert len(shipped(STRATEGIES)) >= 16


SYNTHETIC = {"n_classes": 6, "n_experiences": 3, "train_per_class": 8, "test_per_class": 4}


def _preset(name: str) -> str:
    """The strategy's ``cpu`` preset, else ``micro`` (DyTox), else its first."""
    presets = list(STRATEGIES.get(name).PRESETS)
    return next((p for p in ("cpu", "micro") if p in presets), presets[0])


SHIPPED = [n for n in STRATEGIES.names() if STRATEGIES.get(n).__module__.startswith("clbench.")]


OTHER_VALUES: dict[str, list] = {
    "model": ["cnn", "vit"], "head": ["fixed", "multi"], "optimizer": ["sgd"], "arch": ["imagenet", "cifar"],
    "augment": [("flip",), ()], "memory": ["reservoir", "herding", "class_balanced"],
    "model_args": [{"hidden": [9]}, {"embed_dim": 12, "depth": 1, "num_heads": 2, "patch_size": 4}],
    "arch_overrides": [{"embed_dim": 12, "depth": 1, "num_heads": 2, "patch_size": 4}],
    "lr_milestones": [(1,)], "milestones": [(1,)], "first_milestones": [(1,)], "retrain_milestones": [(1,)],
    "lamb": [0.5], "lora_alpha": [2.0], "scale": [0.5], "size": [2], "prefix_length": [2], "prefix_reparam": [4],
    "warmup": [0.5], "sigma_dp": [0.5], "loss_positions": [1], "first_epochs": [2],
    "route_holdout": [2], "patterns_per_exp": [4], "sample_size": [4], "mem_strength": [1], "subsample": [2],
}


CONTEXT: dict[str, dict] = {
    "lr_milestones": {"epochs": 2}, "milestones": {"epochs": 2}, "first_milestones": {"epochs": 2},
    "retrain_milestones": {"epochs": 2}, "lr_decay": {"epochs": 2, "lr_milestones": (1,), "milestones": (1,)},
    "warmup": {"epochs": 3}, "min_lr": {"epochs": 2}, "error_scale": {"sigma_dp": 0.5},
    "prior_noise": {"sigma_dp": 0.5}, "decay_factor": {"decay_factor": 0.9},   # EWC's online mode needs one
}


BASE: dict[str, dict] = {"er_aml": {"mem_size": 36}, "gss": {"mem_size": 8}}


COMPANIONS: dict[str, dict] = {"ewc.mode": {"decay_factor": 0.5}}


SAME_HERE: dict[str, str] = {
    "model": "'auto' is the scenario's default backbone, an MLP on the synthetic data; no other backbone takes "
             "its flat inputs",
    "dytox.arch": "arch_overrides (the tiny ViT here) replace every field arch sets",
    "dytox_plus.arch": "arch_overrides (the tiny ViT here) replace every field arch sets",
    "er_aml.same_task_neg": "without task labels (class-incremental) every sample is of the same task",
    "weighting": "'samples' weights the members by their sizes, all equal on this balanced data, as 'uniform' does",
}


OPEN: dict[str, str] = {
    "gss.mem_strength": "strategies/rehearsal.py: Avalanche's GSS_greedy compares with min(mem_strength, filled "
                        "memory // batch size) memory subsets, so values above mem_size // batch_size train alike "
                        "(here 8 // 6 = 1; quick's gss: 200 // 32 = 6 < the default 10); to refuse at load",
}


SKIPPED = {"init": "a checkpoint that fits each strategy's backbone: loading is tested in tests/test_models.py, its "
                   "content hash in the identity in tests/test_executors.py",
           **dict.fromkeys(("prune", "prune_lambda", "prune_s_max", "prune_init"),
                           "DER's channel masks need a backbone with BatchNorm (resnet32), which the flat synthetic "
                           "inputs cannot feed: tested in tests/test_strategies_der.py; the weights are refused at "
                           "load without prune: true (declared used only with it)")}


def _candidates(name: str, field: str, value: typing.Any, annotation: typing.Any) -> list:
    out = list(OTHER_VALUES.get(field, []))
    choices = declarations(STRATEGIES.get(name).Config)[field].allowed()
    if choices is not None and not isinstance(value, tuple):
        out += [c for c in choices if c != value]
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        out += [a for a in args if a != value]
    if isinstance(value, bool):
        out.append(not value)
    elif isinstance(value, int):
        out += [value // 2, value + 1, value - 1, value * 2 + 2]
    elif isinstance(value, float):
        out += [value * 2, value / 2, value + 0.1, 0.5, 1.0, -1.0] if value else [0.1, 0.5, 1.0]
    elif value is None:
        out += [2, 0.5, 1] if int in args or float in args else []
    return [c for c in out if c != value]


def _others(name: str, field: str, base: dict) -> typing.Iterator[tuple[typing.Any, typing.Any]]:
    """``(other value, its config)`` for ``field``, for every candidate the configuration accepts."""
    config_cls = STRATEGIES.get(name).Config
    default = build_config(name, _preset(name), base)
    annotation = typing.get_type_hints(config_cls).get(field)
    for candidate in _candidates(name, field, getattr(default, field), annotation):
        try:
            companions = COMPANIONS.get(f"{name}.{field}", {})
            args = {**base, field: candidate, **companions}
            config = build_config(name, _preset(name), args)
            STRATEGIES.get(name).check_entry(config, args, False)      # the suite loader's check, without dp
            yield candidate, config
        except (ConfigError, TypeError, ValueError):
            continue


def _identity(name: str, args: dict) -> str:
    spec = RunSpec("s", ScenarioEntry("synthetic", dict(SYNTHETIC)), StrategyEntry(name, args, preset=_preset(name)), 0)
    return config_hash(spec.identity())


def _trained(name: str, config) -> tuple:
    """What two tiny experiences produce: predictions on test inputs and parameter counts after each step."""
    torch.set_num_threads(1)
    seed_everything(0)
    scenario = scenario_for(name) if STRATEGIES.get(name).scenario_kinds[0] != CLASSIFICATION else \
        SCENARIOS.get("synthetic")(seed=0, **SYNTHETIC)
    seed_everything(0)
    cls = STRATEGIES.get(name)
    strategy = cls(scenario.info, "cpu", config)
    experiences = list(scenario.train_stream)
    counts = []
    for step in ([experiences] if cls.offline else experiences):
        strategy.train(step)
        counts.append(dataclasses.astuple(strategy.num_parameters()))
    x = torch.stack([scenario.test_stream[-1].dataset.eval()[i][0] for i in range(6)])
    with torch.no_grad():
        scores = strategy.predict(x, torch.zeros(6, dtype=torch.long))
    return scores.detach().clone(), counts, strategy.extra_metrics()


def _context(name: str, field: str, fields: list[str]) -> dict:
    """What ``field`` needs to act: the declared example of the setting it is used only with, and :data:`CONTEXT`
    (keys the strategy's Config lacks left out)."""
    need = declarations(STRATEGIES.get(name).Config)[field].only_with
    context = {need.other: need.example} if need is not None else {}
    return {k: v for k, v in {**context, **CONTEXT.get(field, {})}.items() if k in fields}


def _same(a: tuple, b: tuple) -> bool:
    return a[0].shape == b[0].shape and torch.equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2]


def _listed(table: dict, name: str, field: str) -> bool:
    return field in table or f"{name}.{field}" in table


@pytest.mark.parametrize("name", SHIPPED)
def test_every_config_field_changes_the_identity_and_the_result_or_is_listed(name):
    fields = [f.name for f in dataclasses.fields(STRATEGIES.get(name).Config)]
    references: dict[str, tuple] = {}
    no_value, refused, same_identity, ignored, fixed = [], [], [], [], []
    for field in fields:
        if field in SKIPPED:
            continue
        base = {**_tiny(name, _preset(name)), **BASE.get(name, {}), **_context(name, field, fields)}
        key = repr(sorted(base.items()))
        if key not in references:
            references[key] = (_trained(name, build_config(name, _preset(name), base)), _identity(name, base))
        reference, reference_id = references[key]
        candidates = list(_others(name, field, base))
        if not candidates:
            refused.append(field)            # every other value is refused at load: nothing silent
            continue
        results = []                         # changed or not, for the first few values that train
        for value, config in candidates:
            try:
                result = _trained(name, config)
            except Exception:  # noqa: BLE001 - a value the configuration accepts but the model cannot use
                continue
            if _identity(name, {**base, field: value, **COMPANIONS.get(f"{name}.{field}", {})}) == reference_id:
                same_identity.append(field)
            results.append((value, _same(result, reference)))
            if not results[-1][1] or len(results) == 3:
                break
        if not results:
            no_value.append(field)
        elif _listed(OPEN, name, field):
            if not results[-1][1]:
                fixed.append(field)
        elif results[-1][1] and not (_listed(NOT_TRAINING, name, field) or _listed(SAME_HERE, name, field)):
            ignored.append(f"{field}={[v for v, _ in results]!r}")
    assert not (no_value or same_identity or ignored or fixed), (
        f"{name}: no other value trains for {no_value} (add one to OTHER_VALUES); identity unchanged by "
        f"{same_identity}; trained result unchanged by {ignored} (a silently ignored setting: refuse it at load, "
        f"or list it in clbench.config.NOT_TRAINING with the reason); fixed, remove from OPEN: {fixed}")


def test_not_training_lists_only_real_fields_with_a_reason():
    fields = {f.name for n in SHIPPED for f in dataclasses.fields(STRATEGIES.get(n).Config)}
    assert NOT_TRAINING and all(isinstance(r, str) and len(r) > 20 for r in NOT_TRAINING.values())
    assert {k.split(".")[-1] for k in NOT_TRAINING} <= fields
    assert all(k.split(".")[0] in SHIPPED for k in NOT_TRAINING if "." in k)


CONTRACT_SYNTHETIC = {"n_classes": 4, "n_experiences": 2, "train_per_class": 10, "test_per_class": 5}


VIT = {"embed_dim": 8, "depth": 1, "num_heads": 2, "patch_size": 4}


TINY = {"epochs": 1, "first_epochs": None, "finetune_epochs": 1, "batch_size": 6, "eval_batch_size": 64,
        "mem_size": 24, "n_shards": 2, "lr": 0.01, "augment": (), "arch_overrides": VIT,
        "size": 2}                         # PETL r / l: the defaults (r = 512) are refused above the width d = 8


def _accepted(name: str, preset: str, field: str, value) -> bool:
    try:
        build_config(name, preset, {field: value})
    except ConfigError:
        return False
    return True


def _tiny(name: str, preset: str) -> dict:
    """Tiny overrides for the fields this strategy's Config has and accepts (nlft refuses shards; a ViT for tangent
    strategies, an MLP otherwise)."""
    fields = {f.name for f in dataclasses.fields(STRATEGIES.get(name).Config)}
    overrides = {k: v for k, v in TINY.items() if k in fields and _accepted(name, preset, k, v)}
    if "model_args" in fields:
        overrides["model_args"] = {"hidden": [8]} if "model" in fields else VIT
    return overrides


CONTRACT_SCENARIOS = {CLASSIFICATION: lambda: SCENARIOS.get("synthetic")(seed=0, **CONTRACT_SYNTHETIC),
                  NEXT_ITEM: lambda: sequences_scenario(NEXT_ITEM_ROWS, 2, max_len=4, n_items=8)}


def scenario_for(name: str) -> Scenario:
    """A tiny scenario of the first kind strategy ``name`` declares it serves (``scenario_kinds``)."""
    return CONTRACT_SCENARIOS[STRATEGIES.get(name).scenario_kinds[0]]()


CASES = [(name, preset) for name in STRATEGIES.names() if STRATEGIES.get(name).__module__.startswith("clbench.")
         for preset in STRATEGIES.get(name).PRESETS]


@pytest.mark.parametrize("name, preset", CASES)
def test_every_strategy_and_preset_trains_two_experiences_and_predicts(name, preset):
    torch.set_num_threads(1)
    seed_everything(0)
    scenario = scenario_for(name)
    cls = STRATEGIES.get(name)
    strategy = cls(scenario.info, "cpu", build_config(name, preset, _tiny(name, preset)))
    assert isinstance(strategy, StrategyBase)
    experiences = list(scenario.train_stream)
    counts = []
    for i, step in enumerate([experiences] if cls.offline else experiences):
        with hooks_checked(strategy, i):                 # an optimizer step fires the batch hooks
            strategy.train(step)
        counts.append(strategy.num_parameters())
    x = torch.stack([scenario.test_stream[1].dataset.eval()[i][0] for i in range(6)])
    scores = strategy.predict(x, torch.zeros(6, dtype=torch.long))
    assert isinstance(scores, torch.Tensor) and scores.shape[0] == 6 and scores.shape[1] >= 4
    assert torch.isfinite(scores[:, :4]).all()
    for count in counts:
        assert isinstance(count, ParamCount) and 0 < count.trainable <= count.total
    modules = strategy.modules()
    assert modules and all(isinstance(m, torch.nn.Module) for m in modules.values())
    extra = strategy.extra_metrics()
    assert isinstance(extra, dict) and all(isinstance(v, (int, float)) for v in extra.values())


def test_conformance_covers_every_shipped_strategy_and_every_kind_they_serve():
    assert {n for n, _ in CASES} == {n for n in STRATEGIES.names() if STRATEGIES.get(n).__module__.startswith(
        "clbench.")} and len(CASES) >= 2 * 16
    assert {k for n, _ in CASES for k in STRATEGIES.get(n).scenario_kinds} == set(CONTRACT_SCENARIOS)
