"""Value ranges are declared beside the field they are for (:func:`clbench.typecheck.setting`), generic names keep
one central rule (:data:`clbench.typecheck.RANGES` and its suffix/prefix rules), and there is one check
(:func:`clbench.typecheck.check_range`): a value out of range is refused the same way whether it comes from a suite
file or from a ``Config`` built in Python, for every ranged field of every shipped strategy; no shipped number is
left to the fallback rule of an undeclared one.

A plugin author adds a strategy with a new ranged field, a choice field, a field used only with another and a
scenario requirement by declaring them in the strategy's own module (here: this test), with no edit anywhere else;
a suite that sets them wrong is refused at load with one line naming the entry, and a Config built in Python gets
the same checks. A number the author forgot to declare is not accepted unchecked: it must be ``>= 0``, and the
refusal says how to declare another range."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from dataclasses import dataclass

import pytest
import torch

from clbench.config import build_config
from clbench.errors import ConfigError
from clbench.protocol import NEXT_ITEM, ParamCount, PrivateNeed, StrategyBase
from clbench.registry import CALLBACKS, MODELS, SCENARIOS, STRATEGIES
from clbench.suite_file import parse_suite
from clbench.typecheck import AT_LEAST_1, RANGES, Range, RangeChecked, declarations, only_with, range_of, setting

SHIPPED = [n for n in STRATEGIES.names() if STRATEGIES.get(n).__module__.startswith("clbench.")]


def _outside(allowed: Range) -> float:
    """A value just outside ``allowed`` (below its low end, else above its high end)."""
    if allowed.low is not None:
        return allowed.low if allowed.open_low else allowed.low - 1
    return allowed.high if allowed.open_high else allowed.high + 1


def _numeric(annotation: typing.Any) -> bool:
    """An int or float field (or one that may be None), not a container of them."""
    args = typing.get_args(annotation) or (annotation,)
    return any(a in (int, float) for a in args) and typing.get_origin(annotation) not in (tuple, list)


def _ranged_fields() -> list[tuple[str, str, float]]:
    """``(strategy, field, bad value)`` for every numeric field with a bounded range, once per Config class."""
    cases, seen = [], set()
    for name in SHIPPED:
        config_cls = STRATEGIES.get(name).Config
        hints = typing.get_type_hints(config_cls)
        for field, declared in declarations(config_cls).items():
            allowed, _ = declared.range_for(field)
            if config_cls in seen or not _numeric(hints[field]) or allowed.low is None and allowed.high is None:
                continue
            bad = _outside(allowed)
            cases.append((name, field, float(bad) if float in (typing.get_args(hints[field]) or (hints[field],))
                          else int(bad)))
        seen.add(config_cls)
    return cases


CASES = _ranged_fields()


def test_every_shipped_config_is_range_checked_at_construction():
    assert [n for n in SHIPPED if not issubclass(STRATEGIES.get(n).Config, RangeChecked)] == []


def test_every_shipped_number_declares_its_range_or_has_a_generic_name():
    """The fallback for an undeclared number (``>= 0``) is for plugins that forgot: every shipped Config number
    declares its range beside it or is a generic name (``lr``, ``*_size``, ``n_*``)."""
    undeclared = sorted({f"{STRATEGIES.get(n).Config.__name__}.{field}" for n in SHIPPED
                         for field, declared in declarations(STRATEGIES.get(n).Config).items()
                         if not declared.range_for(field)[1]
                         and _numeric(typing.get_type_hints(STRATEGIES.get(n).Config)[field])})
    assert undeclared == []


def test_the_central_table_names_generic_fields_only():
    """Each name of :data:`RANGES` is shared: by the Configs of several strategy modules, or by a model, scenario or
    callback factory (whose parameters have no declarations of their own). A strategy's own field declares its
    range beside it."""
    modules: dict[str, set[str]] = {}
    for name in SHIPPED:
        for field in declarations(STRATEGIES.get(name).Config):
            modules.setdefault(field, set()).add(STRATEGIES.get(name).__module__)
    parameters = {param for registry in (MODELS, SCENARIOS, CALLBACKS) for name in registry.names()
                  for param in inspect.signature(registry.get(name)).parameters}
    assert [f for f in RANGES if f not in parameters and len(modules.get(f, ())) < 2] == []


def test_the_cases_cover_the_ranges_declared_beside_their_fields():
    covered = {field for _, field, _ in CASES}
    assert {"epochs", "batch_size", "mem_size", "lr", "prune_s_max", "prune_init", "retrain_temperature",
            "sigma_dp", "prior_noise", "warmup", "loss_positions", "route_holdout", "n_shards", "last_blocks",
            "size", "prefix_length", "prefix_reparam", "scale", "lora_alpha", "first_epochs", "retrain_epochs",
            "kd_tau", "decay_factor", "kappa", "temperature", "val_percentage", "lamb", "heads"} <= covered


@pytest.mark.parametrize(("strategy", "field", "bad"), CASES, ids=[f"{s}.{f}" for s, f, _ in CASES])
def test_an_out_of_range_value_is_refused_alike_from_a_suite_and_from_python(strategy, field, bad):
    with pytest.raises(ConfigError) as loaded:
        build_config(strategy, None, {field: bad})
    with pytest.raises(ValueError) as built:
        STRATEGIES.get(strategy).Config(**{field: bad})
    allowed, _ = declarations(STRATEGIES.get(strategy).Config)[field].range_for(field)
    message = f"{field}: {bad!r} is out of range: {field} must be {allowed}"
    assert message in str(loaded.value) and str(built.value) == message


@pytest.mark.parametrize(("strategy", "field", "inside", "outside"), [
    ("der", "prune_s_max", 1.0001, 1.0), ("seqrec", "warmup", 0.0, 1.0), ("der", "retrain_temperature", 1e-9, 0.0),
    ("lora", "prefix_reparam", 0, -1), ("lora", "lora_alpha", 1e-9, 0.0), ("seqrec", "sigma_dp", 0.0, -1e-9),
    ("bic", "lamb", -1.0, -1.5), ("ewc_online", "decay_factor", 1.0, 0.0)])
def test_the_edges_of_the_declared_ranges(strategy, field, inside, outside):
    allowed, declared = declarations(STRATEGIES.get(strategy).Config)[field].range_for(field)
    assert declared and inside in allowed and outside not in allowed and not math.isnan(inside)


def test_a_field_declares_its_own_range_over_the_generic_rule_of_its_name():
    """``lora_alpha`` ends with ``_alpha`` (generic: ``>= 0``) but declares ``> 0``; a generic name without a
    declaration keeps the central rule."""
    declared = declarations(STRATEGIES.get("lora").Config)
    assert range_of("lora_alpha") == Range(0) and declared["lora_alpha"].range_for("lora_alpha")[0] == \
        Range(0, open_low=True)
    assert declared["lr"].range_for("lr") == (RANGES["lr"], True)
    assert {f.name for f in dataclasses.fields(STRATEGIES.get("lora").Config)} == set(declared)


@dataclass
class EchoConfig(RangeChecked):
    lr: float = 0.1                                                    # a generic name: the central rule
    train_experiences: int = setting(2, within=AT_LEAST_1)             # a new ranged field
    shrink: float = setting(0.5, within=Range(0, 1, open_low=True))
    flavour: str = setting("plain", choices=("plain", "spicy"))        # a choice field
    spice: float = setting(1.0, within=Range(0), only_with=only_with("flavour", "spicy"))
    forgotten: int = 3                                                 # declared nowhere: >= 0
    memory_slots: int = 0


class Echo(StrategyBase):
    """Scores every item alike: what matters here is what it declares."""

    Config = EchoConfig
    PRESETS = {"cpu": {}}
    private = True
    scenario_kinds = (NEXT_ITEM,)                                      # a scenario requirement
    private_needs = (PrivateNeed("memory_slots", lambda slots: slots == 0,
                                 "dp with memory slots ({value}) is refused: set memory_slots: 0."),)

    def train(self, experience) -> None:
        pass

    def predict(self, x, task_labels):
        return torch.zeros(len(x), self.info.extra["n_items"])

    def num_parameters(self) -> ParamCount:
        return ParamCount(1, 1)


def _suite(args: dict, scenario: str = "movielens_seqrec", **entry) -> dict:
    return {"suite": "s", "scenarios": [{"name": scenario}],
            "strategies": [{"name": "test_echo", "preset": "cpu", "args": args, **entry}]}


@pytest.fixture
def echo(registered):
    return registered(STRATEGIES, "test_echo", Echo)


@pytest.mark.parametrize(("data", "message"), [
    (_suite({"train_experiences": 0}), "args.train_experiences: 0 is out of range: train_experiences must be >= 1"),
    (_suite({"shrink": 0.0}), "args.shrink: 0.0 is out of range: shrink must be in (0, 1]"),
    (_suite({"flavour": "spicey"}),
     "args.flavour: unknown flavour 'spicey'. Did you mean 'spicy'? Choose one of: plain, spicy."),
    (_suite({"spice": 2.0}), "args.spice is used only with flavour: spicy (this entry's flavour is 'plain'), so it "
                             "would change nothing; remove it or set flavour."),
    (_suite({"forgotten": -1}), "args.forgotten: -1 is out of range: forgotten must be >= 0 (the rule of a Config "
                                "number that declares no range; declare its own with "
                                "clbench.typecheck.setting(default, within=Range(...)) beside the field)"),
    (_suite({}, scenario="synthetic"), "it serves next_item scenarios, and scenarios[0] (synthetic) is a "
                                       "classification scenario; every strategy of a suite runs on every scenario, "
                                       "so put them in separate suites."),
    (_suite({"memory_slots": 4}, dp={"epsilon": 3.0}), "dp with memory slots (4) is refused: set memory_slots: 0."),
])
def test_a_plugin_strategys_declarations_are_checked_when_its_suite_loads(echo, data, message):
    with pytest.raises(ConfigError) as info:
        parse_suite(data, "s.yaml")
    assert str(info.value).startswith("s.yaml: strategies[0] (test_echo)") and str(info.value).endswith(message)
    assert "\n" not in str(info.value)


def test_the_same_entry_loads_where_its_settings_act(echo):
    suite = parse_suite(_suite({"train_experiences": 5, "flavour": "spicy", "spice": 2.0, "forgotten": 0},
                               dp={"epsilon": 3.0}), "s.yaml")
    assert suite.strategies[0].args == {"train_experiences": 5, "flavour": "spicy", "spice": 2.0, "forgotten": 0}


@pytest.mark.parametrize(("values", "message"), [
    ({"train_experiences": -1}, "train_experiences: -1 is out of range: train_experiences must be >= 1"),
    ({"flavour": "mild"}, "flavour: unknown flavour 'mild'. Choose one of: plain, spicy."),
    ({"forgotten": -2}, "forgotten: -2 is out of range: forgotten must be >= 0 (the rule of a Config number"),
])
def test_a_config_built_in_python_gets_the_same_checks(values, message):
    with pytest.raises(ValueError) as info:
        EchoConfig(**values)
    assert str(info.value).startswith(message)
