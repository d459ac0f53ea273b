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
from typing import Annotated, Literal

import pytest
import torch

from clbench import typecheck
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


def test_parameter_declarations_read_annotated_ranges_and_declarations():
    def factory(*, a: Annotated[int, typecheck.AT_LEAST_1] = 1, b: int = 0,
                c: Annotated[str, typecheck.Declared(choices=("x", "y"))] = "x") -> None: ...

    declared = typecheck.parameter_declarations(factory)
    assert declared == {"a": typecheck.Declared(within=typecheck.AT_LEAST_1),
                        "c": typecheck.Declared(choices=("x", "y"))}
    with pytest.raises(typecheck.TypeMismatch, match="c: unknown c 'z'"):
        typecheck.check_values({"c": "z"}, {"c": str}, declared=declared)
    assert typecheck.check_values({"b": -3}, {"b": int}, declared=declared) == {"b": -3}   # generic rule only


# ------------------------------------------------------------------ the loader's building blocks (mutation testing)
@pytest.mark.parametrize(("allowed", "text"), [
    (typecheck.Range(), "any finite number"), (typecheck.Range(high=2), "<= 2"),
    (typecheck.Range(high=2, open_high=True), "< 2"), (typecheck.Range(1), ">= 1"),
    (typecheck.Range(0, open_low=True), "> 0"), (typecheck.Range(0, 1), "in [0, 1]"),
    (typecheck.Range(0, 1, open_low=True, open_high=True), "in (0, 1)"),
    (typecheck.Range(0, 1, open_high=True), "in [0, 1)"), (typecheck.Range(0.5, 1e6, open_low=True), "in (0.5, 1e+06]"),
])
def test_a_range_reads_as_the_interval_it_checks(allowed, text):
    assert str(allowed) == text


@pytest.mark.parametrize(("value", "tp", "expected"), [
    ([1, "2"], tuple, (1, "2")),
    ([1, "2"], tuple[int, ...], (1, 2)),
    ([1, 2.0], tuple[int, int], (1, 2)),
    ([], tuple[int, ...], ()),
    ([1, "x"], list, [1, "x"]),
])
def test_tuples_and_lists_are_coerced_item_by_item(value, tp, expected):
    out = typecheck.coerce(value, tp, "k")
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize(("value", "tp", "message"), [
    ([1, 2, 3], tuple[int, int], "k: expected 2 items, got 3: [1, 2, 3]"),
    ([1], tuple[int, int], "k: expected 2 items, got 1: [1]"),
    ([1, 1.5], tuple[int, ...], "k[1]: expected an int, got 1.5"),
])
def test_a_tuple_of_the_wrong_length_or_items_is_refused_naming_the_item(value, tp, message):
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(value, tp, "k")
    assert str(info.value) == message


def test_setting_makes_a_dataclass_field_with_its_declaration():
    import dataclasses

    need = typecheck.only_with("mode", "a")

    @dataclasses.dataclass
    class Config:
        mode: str = "b"
        size: int = typecheck.setting(3, within=typecheck.AT_LEAST_1, at_most="train_samples")
        tags: list = typecheck.setting(default_factory=lambda: ["x"], choices=("x", "y"), only_with=need)

    fields = {f.name: f for f in dataclasses.fields(Config)}
    assert Config() == Config("b", 3, ["x"]) and Config().tags is not Config().tags
    assert fields["size"].metadata["clbench"] == typecheck.Declared(typecheck.AT_LEAST_1, None, None, "train_samples")
    assert fields["tags"].metadata["clbench"] == typecheck.Declared(None, ("x", "y"), need, None)
    declared = typecheck.declarations(Config)
    assert declared["mode"] is typecheck.NOTHING_DECLARED
    assert declared["size"].bound_for("size") == "train_samples" and declared["tags"].bound_for("tags") is None
    assert declared["mode"].bound_for("mem_size") == "train_samples"
    assert need.test("a") and not need.test("b") and need.wanted == "a" and need.example == "a"


def test_only_with_reads_a_boolean_as_yaml_writes_it():
    flag, mode = typecheck.only_with("flag", True), typecheck.only_with("mode", "Sgd")
    assert (flag.other, flag.wanted, flag.example) == ("flag", "true", True) and flag.test(True) and not flag.test(1.5)
    assert (mode.wanted, mode.example) == ("Sgd", "Sgd") and mode.test("Sgd") and not mode.test("sgd")


@pytest.mark.parametrize(("tp", "value", "message"), [
    (int, "x", "k: expected an int, got 'x'"),
    (float, [], "k: expected a float, got []"),
    (int | None, "x", "k: expected int or None, got 'x'"),
    (type(None), 1, "k: expected None, got 1"),
    (tuple[int, ...], 3, "k: expected a tuple[int, ...], got 3"),
    (dict[str, int], 3, "k: expected a dict[str, int], got 3"),
    (typing.Literal["a", "b"] | None, 3, "k: expected 'a' or 'b' or None, got 3"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_type(tp, value, message):
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(value, tp, "k")
    assert str(info.value) == message and info.value.key == "k"


def test_in_a_union_the_member_a_container_already_has_wins():
    out = typecheck.coerce([1], tuple[float, ...] | tuple[int, ...], "k")
    assert out == (1,) and type(out[0]) is int


def test_type_names_drop_the_typing_prefix():
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(3, dict[str, typing.Any], "k")
    assert str(info.value) == "k: expected a dict[str, Any], got 3"


# ----------------------------------------------------------- the coercion rules, one by one (config group, 4628a59)
@pytest.mark.parametrize(("value", "tp", "message"), [
    ("c", Literal["a", "b"], "k: 'c' is not one of 'a', 'b'"),          # a string, but not one of the strings
    (1, Literal[True], "k: 1 is not one of True"),                     # equal, but not of the literal's type
    ({"a": "x"}, dict[str, int], "k.a: expected an int, got 'x'"),      # a value, named by its key
    ({"x": "a"}, dict[int, str], "k['x']: expected an int, got 'x'"),   # a key, named in brackets
])
def test_a_literal_or_a_dict_entry_that_does_not_fit_is_refused_naming_it(value, tp, message):
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(value, tp, "k")
    assert str(info.value) == message


def test_dict_keys_and_values_are_coerced_to_their_own_types():
    from collections.abc import Mapping

    out = typecheck.coerce({"1": "a", 2.0: "b"}, dict[int, str], "k")
    assert out == {1: "a", 2: "b"} and all(type(key) is int for key in out)
    out = typecheck.coerce({"a": "1", "b": 2.0}, dict[str, int], "k")
    assert out == {"a": 1, "b": 2} and all(type(value) is int for value in out.values())
    out = typecheck.coerce({"a": 2.0}, Mapping[str, int], "k")
    assert out == {"a": 2} and type(out["a"]) is int


@pytest.mark.parametrize(("value", "tp", "expected"), [
    ({"a": "1"}, dict[str, int] | dict[str, str], {"a": "1"}),       # the member that takes the dict as it is
    ({"1": "a"}, dict[int, str] | dict[str, str], {"1": "a"}),       # ... its keys as they are, too
    (["1"], tuple[int | None, ...] | tuple[str, ...], ("1",)),          # a union inside a member, strict too
    ("1", int | str, "1"),                                              # a string stays one before it is parsed
])
def test_a_union_takes_the_first_member_that_needs_no_coercion_down_to_nested_members(value, tp, expected):
    out = typecheck.coerce(value, tp, "k")
    assert out == expected and type(out) is type(expected)        # {"a": 1}, (1,) and 1 are not equal to these


def test_a_range_is_checked_on_every_number_of_a_list_and_its_rule_named_by_whose_it_is():
    """The generic rule of a name (``lr > 0``) reads as the name's own; a Config number without a range of its own
    or of its name gets :data:`~clbench.typecheck.UNDECLARED` with a hint to declare one."""
    for value in (-1.0, [0.1, -1.0]):
        with pytest.raises(typecheck.TypeMismatch) as info:
            typecheck.check_range("lr", value, "k")
        assert str(info.value) == "k: -1.0 is out of range: lr must be > 0"

    @dataclasses.dataclass
    class Config(typecheck.RangeChecked):
        mode: str = typecheck.setting("a", choices=("a", "b"))
        foo_count: int = 0
        lr: float = 0.1

    for values, message in [
        ({"mode": "z"}, "mode: unknown mode 'z'. Choose one of: a, b."),
        ({"foo_count": -1}, "foo_count: -1 is out of range: foo_count must be >= 0 (the rule of a Config number that "
                            "declares no range; declare its own with clbench.typecheck.setting(default, "
                            "within=Range(...)) beside the field)"),
        ({"lr": -1.0}, "lr: -1.0 is out of range: lr must be > 0"),
    ]:
        with pytest.raises(typecheck.TypeMismatch) as info:
            Config(**values)
        assert str(info.value) == message


def test_brief_keeps_a_repr_of_160_characters_and_cuts_a_longer_one_to_157_and_an_ellipsis():
    exactly, longer = ["a" * 76, "b" * 76], ["a" * 76, "b" * 77]
    assert len(repr(exactly)) == typecheck.BRIEF_LENGTH == 160
    assert typecheck.brief(exactly) == repr(exactly)
    assert typecheck.brief(longer) == repr(longer)[:157] + "..."


def test_a_boolean_is_not_a_number_even_for_a_numeric_abstract_type():
    import numbers

    assert typecheck.coerce(2.5, numbers.Real, "k") == 2.5
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(True, numbers.Real, "k")
    assert str(info.value) == "k: expected a Real, got True"


HEADS = typecheck.Divides("num_heads", "embed_dim", "heads split the width")
PATCH = typecheck.Divides("patch_size", "height", "patches tile the image")


def test_check_divides_names_the_first_broken_rule_its_values_and_the_fix():
    """A rule between two parameters and a rule on an axis of the input shape ``(C, H, W)``: the first broken one is
    refused in one line naming the divisor, the dividend (the scenario's axis by name), why and the fix; a rule that
    holds, and every later rule once one is refused, is not named."""
    with pytest.raises(ValueError) as caught:
        typecheck.check_divides([HEADS, PATCH], {"num_heads": 5, "embed_dim": 64, "patch_size": 5}, (3, 32, 32), "s")
    assert str(caught.value) == ("num_heads 5 does not divide embed_dim 64 (heads split the width); set num_heads to a "
                                 "divisor of 64.")
    with pytest.raises(ValueError) as caught:
        typecheck.check_divides([HEADS, PATCH], {"num_heads": 8, "embed_dim": 64, "patch_size": 5}, (3, 32, 28),
                                "scenarios[1] (x)")
    assert str(caught.value) == ("patch_size 5 does not divide the image height 32 of scenarios[1] (x) (patches tile "
                                 "the image); set patch_size to a divisor of 32.")
    with pytest.raises(ValueError, match="^patch_size 5 does not divide the image height 32 of the scenario "):
        typecheck.check_divides([PATCH], {"patch_size": 5}, (3, 32, 32))
    width = typecheck.Divides("patch_size", "width", "w")
    with pytest.raises(ValueError, match="^patch_size 3 does not divide the image width 28 of s "):
        typecheck.check_divides([width], {"patch_size": 3}, (1, 27, 28), "s")
    typecheck.check_divides([HEADS, PATCH, width], {"num_heads": 8, "embed_dim": 64, "patch_size": 4}, (1, 32, 28))
    typecheck.check_divides([HEADS], {"num_heads": 1, "embed_dim": 7})                 # 1 divides anything
    with pytest.raises(ValueError, match="^num_heads 2 does not divide embed_dim 1 "):   # and 1 is divided by 1 only
        typecheck.check_divides([HEADS], {"num_heads": 2, "embed_dim": 1})


@pytest.mark.parametrize(("args", "shape"), [
    ({"num_heads": 5, "embed_dim": None, "patch_size": 5}, None),            # unknown dividend, unknown shape
    ({"patch_size": 5}, (32, 32)),                                           # not an image shape (C, H, W)
    ({"patch_size": 5}, (3, 32, 32, 1)),
    ({"num_heads": True, "embed_dim": 3, "patch_size": 5.0}, (3, 32, 32)),   # booleans and floats are not counts
    ({"num_heads": 2, "embed_dim": True, "patch_size": "5"}, (3, 32, 32)),
    ({"num_heads": 0, "embed_dim": 3, "patch_size": -5}, (3, 32, 32)),       # not positive: the range's refusal
    ({"num_heads": 2, "embed_dim": 0}, (3, 32, 32)),
    ({"num_heads": 2, "embed_dim": -3}, (3, 32, 32)),
    ({}, (3, 32, 32)),                                                       # not given
])
def test_check_divides_leaves_values_that_are_not_positive_counts_and_shapes_it_cannot_read(args, shape):
    """Only positive integers on both sides and a shape of three axes are checked; anything else is left to the
    range and type checks (or to the model when built): no refusal, no ZeroDivisionError."""
    typecheck.check_divides([HEADS, PATCH], args, shape)
