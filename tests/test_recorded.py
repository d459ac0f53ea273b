"""The registries' index (:mod:`clbench.recorded`): what it records of each shipped strategy's Config and each
scenario's sizes, what it cannot record, and when a record is stale."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Annotated, Literal

import pytest

from clbench import typecheck
from clbench.registry import CALLBACKS, SCENARIOS, STRATEGIES


class _Recorded:
    """A strategy without PRESETS whose Config declares a range, a scenario bound, a Literal and an Any field."""

    @dataclasses.dataclass
    class Config:
        lr: float = 0.1
        mem_size: int = typecheck.setting(100, within=typecheck.Range(1), at_most="experience_samples")
        mode: Literal["a", "b"] = "a"
        anything: typing.Any = None


def _sizes_kwargs(*, n_experiences: int = 5, **kwargs) -> dict:
    return {}


def _sizes_required(*, n_experiences: int, **_) -> dict:
    return {}


def _sizes_positional(n_experiences: int = 5, /, **_) -> dict:
    return {}


def _sizes_ok(*, n_experiences: int = 5, max_per_class: int | None = None, **_) -> dict:
    return {}


def test_every_shipped_strategy_scenario_and_callback_is_recorded_in_the_index():
    """Shipped: registered by clbench's own modules (a test module imported earlier in the session, such as
    tests._fakes, registers names the index rightly does not hold). Every scenario and callback has its keyword
    parameters recorded; sizes only where the scenario declares them."""
    from clbench.plugins import INDEX_FILE

    def shipped(registry) -> set[str]:
        return {n for n in registry.names() if registry.module_of(n).split(".")[0] == "clbench"}

    modules = json.loads(INDEX_FILE.read_text())["modules"].values()
    recorded = {kind: set().union(*(m.get("records", {}).get(kind, {}) for m in modules))
                for kind in ("strategy", "scenario", "callback")}
    assert recorded["strategy"] == shipped(STRATEGIES)
    assert recorded["scenario"] == shipped(SCENARIOS) and recorded["callback"] == shipped(CALLBACKS)
    sized = {n for m in modules for n, r in m.get("records", {}).get("scenario", {}).items() if "sizes" in r}
    assert sized == {n for n in shipped(SCENARIOS) if getattr(SCENARIOS.get(n), "sizes", None)}


@pytest.mark.parametrize("annotation, text", [
    (Literal["a", 1, 2.5, True, None], "Literal['a', 1, 2.5, True, None]"), (typing.Any, "Any"),
    (type(None), "None"), (int | None, "int | None"), (tuple[int, ...], "tuple[int, ...]"),
    (dict[str, list[float]], "dict[str, list[float]]"), (Literal["x", "y"] | None, "Literal['x', 'y'] | None")])
def test_an_annotation_is_recorded_as_text_that_reads_back_as_it(annotation, text):
    from clbench import recorded

    assert recorded.annotation_text(annotation) == text
    assert recorded.parse_annotation(text) == annotation


@pytest.mark.parametrize("annotation", [set[int], Literal[b"x"], typing.Callable],
                         ids=["set", "literal_of_bytes", "callable"])
def test_an_annotation_the_index_cannot_write_is_unrecordable(annotation):
    """Such a strategy is left to the full check (its record is None)."""
    from clbench import recorded

    with pytest.raises(recorded.Unrecordable):
        recorded.annotation_text(annotation)


def test_a_strategy_record_holds_each_fields_declarations_and_no_presets_when_the_class_has_none():
    from clbench import recorded

    assert recorded.strategy_record(_Recorded) == {
        "fields": [{"name": "lr", "type": "float", "default": 0.1},
                   {"name": "mem_size", "type": "int", "default": 100,
                    "within": {"low": 1, "high": None, "open_low": False, "open_high": False},
                    "at_most": "experience_samples"},
                   {"name": "mode", "type": "Literal['a', 'b']", "default": "a"},
                   {"name": "anything", "type": "Any", "default": None}],
        "presets": {}, "depends": [__name__], "private": False, "private_needs": []}


def test_a_strategy_whose_stand_in_would_differ_is_not_recorded():
    """A tuple default under ``Any`` would come back from the record as a list: the stand-in's signature differs,
    so no record (the full check handles the strategy)."""
    from clbench import recorded

    class Tupled:
        Config = dataclasses.make_dataclass("Config", [("x", typing.Any, dataclasses.field(default=(1, 2)))])

    assert recorded.strategy_record(Tupled) is None


def test_a_strategy_record_is_kept_only_when_the_stand_in_has_the_same_types_only_with_and_presets(monkeypatch):
    """The stand-in's signature is compared field by field: a record whose type text is wrong (here every field
    written as ``int``), an ``only_with`` value or a preset that comes back as a list instead of a tuple, each make
    the record None (the full check handles the strategy)."""
    from clbench import recorded

    class Typed:
        Config = dataclasses.make_dataclass("Config", [("lr", float, dataclasses.field(default=0.5))])

    class Needing:
        Config = dataclasses.make_dataclass("Config", [
            ("mode", typing.Any, dataclasses.field(default=None)),
            ("x", int, typecheck.setting(1, only_with=typecheck.only_with("mode", (1, 2))))])

    class Preset:
        Config = dataclasses.make_dataclass("Config", [("x", typing.Any, dataclasses.field(default=None))])
        PRESETS = {"p": {"x": (1, 2)}}

    assert recorded.strategy_record(Typed)["fields"] == [{"name": "lr", "type": "float", "default": 0.5}]
    assert recorded.strategy_record(Needing) is None
    assert recorded.strategy_record(Preset) is None
    monkeypatch.setattr(recorded, "annotation_text", lambda tp: "int")
    assert recorded.strategy_record(Typed) is None


def test_a_scenario_record_holds_the_sizes_of_the_arguments_the_loader_accepts(monkeypatch):
    """The defaults and each shipped suite's arguments, checked as the loader checks them (the declared range, the
    annotation): ``n=0`` (below the range) and ``n=3.5`` (not an int) are left to the loader, ``n=3`` after them is
    still recorded."""
    from clbench import recorded

    def factory(n: Annotated[int, typecheck.Range(1)] = 2, **_):
        raise AssertionError("the factory itself is not called")

    factory.sizes = lambda n=2, **_: {"train_samples": 10 * n, "experience_samples": n}
    monkeypatch.setattr(recorded, "_suite_arguments", lambda: {"fake": [{"n": 0}, {"n": 3.5}, {"n": 3}]})
    assert recorded.scenario_record("fake", factory) == {
        "params": {"n": 2}, "depends": [__name__], "datasets": [],
        "signature": {"params": [{"name": "n", "type": "int", "default": 2, "within": {
            "low": 1, "high": None, "open_low": False, "open_high": False}}], "var_keyword": True},
        "sizes": [{"args": {"n": 2}, "sizes": {"train_samples": 20, "experience_samples": 2}},
                  {"args": {"n": 3}, "sizes": {"train_samples": 30, "experience_samples": 3}}]}


def test_recorded_values_are_json_data_and_anything_else_is_unrecordable():
    """Tuples become lists, nested; a dict with a non-string key, a non-finite float, a set or another object cannot
    be written (its strategy is left to the full check)."""
    import math

    from clbench import recorded

    assert recorded._data({"x": (1, [2.5, None]), "y": True, "z": "s"}) == {"x": [1, [2.5, None]], "y": True, "z": "s"}
    for value in ({1: 2}, math.inf, math.nan, {"a"}, object()):
        with pytest.raises(recorded.Unrecordable):
            recorded._data(value)


def test_recorded_sizes_are_found_whatever_the_order_of_the_sizes_functions_parameters(monkeypatch):
    """A ``sizes`` function whose parameters are not in alphabetical order (``b`` before ``a``): the arguments a
    suite gives are matched to the recorded ones as JSON with sorted keys; arguments not recorded give None (the
    full check computes them), as does a scenario without a record."""
    from clbench import recorded

    def factory(b: int = 1, a: int = 2):
        raise AssertionError("the factory itself is not called")

    factory.sizes = lambda b=1, a=2: {"train_samples": 10 * a + b}
    monkeypatch.setattr(recorded, "_suite_arguments", lambda: {"fake": [{"a": 3}]})
    record = recorded.scenario_record("fake", factory)
    assert record["params"] == {"b": 1, "a": 2}
    assert recorded.recorded_sizes(record, {}) == {"train_samples": 21}
    assert recorded.recorded_sizes(record, {"b": 1, "a": 3}) == {"train_samples": 31}
    assert recorded.recorded_sizes(record, {"b": 2}) is None
    assert recorded.recorded_sizes(None, {}) is None


def test_a_record_is_not_used_once_a_module_it_depends_on_changed(monkeypatch):
    from clbench import plugins

    assert plugins.record("strategy", "replay") is not None and plugins.record("scenario", "split_digits")
    monkeypatch.setattr(plugins, "_sha256_of", lambda module: "edited since")
    assert plugins.record("strategy", "replay") is None and plugins.record("scenario", "split_digits") is None


@pytest.mark.parametrize("sizes", [_sizes_kwargs, _sizes_required, _sizes_positional])
def test_a_sizes_function_the_index_cannot_key_is_not_recorded(sizes):
    """Only keyword parameters with defaults (and ``**_``) can be keyed from a suite's arguments: a ``**kwargs`` that
    may read anything, a parameter without a default or a positional-only one leaves the scenario to the full check."""
    from clbench.recorded import _size_params

    assert _size_params(sizes) is None


def test_a_sizes_function_with_keyword_defaults_is_recorded_with_them():
    from clbench.recorded import _size_params

    assert _size_params(_sizes_ok) == {"n_experiences": 5, "max_per_class": None}


def test_a_scenario_record_holds_its_datasets_and_input_shapes_and_depends_on_each_declared_functions_module(
        monkeypatch):
    """A scenario with an ``input_shape`` function (no ``sizes``) and a dataset: the record holds the dataset as
    data, the shape of each accepted argument set as a list (None where the data decide it), no sizes, and the
    modules of the factory and of its declared function, sorted; :func:`recorded_shape` reads a shape back as a
    tuple, and None for arguments not recorded, a shape the data decide, a record without shapes and no record."""
    from clbench import recorded
    from clbench.data.catalog import DatasetSpec, Layout

    def factory(n: Annotated[int, typecheck.Range(1)] = 2, **_):
        raise AssertionError("the factory itself is not called")

    def input_shape(n=2, **_):
        return None if n == 3 else (1, 8 * n, 8)

    input_shape.__module__ = "a_shapes_module"
    factory.input_shape = input_shape
    factory.datasets = (DatasetSpec("toy", (Layout("toy", {"a.npy": None, "b.npy": "sha"}, read=lambda f: None,
                                                   gzip_ok=True), Layout("toy2", {"c": None}, read=lambda f: None)),
                                    how_to_get="ask"),)
    monkeypatch.setattr(recorded, "_suite_arguments", lambda: {"fake": [{"n": 0}, {"n": 3}, {"n": 4}]})
    record = recorded.scenario_record("fake", factory)
    assert "sizes" not in record and "params" not in record
    assert record["datasets"] == [{"name": "toy", "download": False, "how_to_get": "ask", "layouts": [
        {"folder": "toy", "files": ["a.npy", "b.npy"], "gzip_ok": True},
        {"folder": "toy2", "files": ["c"], "gzip_ok": False}]}]
    assert record["shapes"] == {"params": {"n": 2}, "rows": [{"args": {"n": 2}, "shape": [1, 16, 8]},
                                                             {"args": {"n": 3}, "shape": None},
                                                             {"args": {"n": 4}, "shape": [1, 32, 8]}]}
    assert record["depends"] == sorted(["a_shapes_module", __name__])
    assert recorded.recorded_shape(record, {}) == (1, 16, 8)
    assert recorded.recorded_shape(record, {"n": 4}) == (1, 32, 8)
    assert recorded.recorded_shape(record, {"n": 3}) is None and recorded.recorded_shape(record, {"n": 5}) is None
    assert recorded.recorded_sizes(record, {}) is None and recorded.recorded_shape(None, {}) is None
    assert recorded.recorded_shape({"sizes": [], "params": {}}, {}) is None
    assert recorded.recorded_shape(record, {"n": {1}}) is None          # arguments the index cannot key

    def sizes(n=2, **_):
        return {"train_samples": 10 * n}

    sizes.__module__ = "a_sizes_module"
    factory.sizes = sizes
    assert recorded.scenario_record("fake", factory)["depends"] == sorted(["a_shapes_module", "a_sizes_module",
                                                                           __name__])


def test_a_model_record_holds_its_signature_and_divisibility_rules():
    from clbench import recorded

    def model(num_heads: Annotated[int, typecheck.Range(1)] = 4, embed_dim: int = 64, *, name: str = "m"):
        raise AssertionError("the factory itself is not called")

    model.divides = (typecheck.Divides("num_heads", "embed_dim", "heads"),
                     typecheck.Divides("patch", "height", "patches"))
    assert recorded.model_record("vitish", model) == {
        "signature": {"params": [
            {"name": "num_heads", "type": "int", "default": 4,
             "within": {"low": 1, "high": None, "open_low": False, "open_high": False}},
            {"name": "embed_dim", "type": "int", "default": 64}, {"name": "name", "type": "str", "default": "m"}],
            "var_keyword": False},
        "depends": [__name__],
        "divides": [{"divisor": "num_heads", "dividend": "embed_dim", "why": "heads"},
                    {"divisor": "patch", "dividend": "height", "why": "patches"}]}
    del model.divides
    assert recorded.model_record("plain", model)["divides"] == []


class _Callback:
    """A callback class: a static choice, a computed choice (a registry's names), a range, a setting used only with
    another, a default the index cannot write, a parameter without annotation and ``**kwargs``."""

    def __init__(self, mode: Annotated[str, typecheck.Declared(choices=("a", "b"))] = "a",
                 model: Annotated[str, typecheck.Declared(choices=lambda: ["mlp", "cnn"])] = "mlp",
                 rate: Annotated[float, typecheck.Range(0, 1, open_low=True)] = 0.5,
                 extra: Annotated[int, typecheck.Declared(only_with=typecheck.only_with("mode", "b"))] = 1,
                 odd: frozenset = frozenset(), plain=3, **kwargs) -> None:
        pass


def test_a_callback_signature_records_each_declaration_and_reads_back_with_or_without_computed_choices():
    """The record of a class's ``__init__`` (``self`` left out): types, defaults, ranges, static and computed
    choices (the latter marked ``computed``), ``only_with`` as data; a default it cannot write leaves that parameter
    with no type, and a parameter without annotation has its default and no type. :func:`declared_parameters` reads
    it back: computed choices only when asked for."""
    from clbench import recorded

    signature = recorded.signature_record(_Callback)
    assert signature == {"var_keyword": True, "params": [
        {"name": "mode", "type": "str", "default": "a", "choices": ["a", "b"]},
        {"name": "model", "type": "str", "default": "mlp", "choices": ["mlp", "cnn"], "computed": True},
        {"name": "rate", "type": "float", "default": 0.5,
         "within": {"low": 0, "high": 1, "open_low": True, "open_high": False}},
        {"name": "extra", "type": "int", "default": 1,
         "only_with": {"other": "mode", "equals": "b", "wanted": "b", "example": "b"}},
        {"name": "odd", "type": None}, {"name": "plain", "type": None, "default": 3}]}
    hints, declared, defaults = recorded.declared_parameters(signature, computed_choices=False)
    assert hints == {"mode": str, "model": str, "rate": float, "extra": int}
    assert defaults == {"mode": "a", "model": "mlp", "rate": 0.5, "extra": 1}
    assert declared["mode"].choices == ["a", "b"] and declared["model"].choices is None
    assert declared["rate"].within == typecheck.Range(0, 1, open_low=True) and declared["mode"].within is None
    assert declared["extra"].only_with == typecheck.only_with("mode", "b") and declared["mode"].only_with is None
    _, declared, _ = recorded.declared_parameters(signature, computed_choices=True)
    assert declared["model"].choices == ["mlp", "cnn"]


def test_a_strategy_record_holds_whether_it_may_train_privately_and_the_needs_it_can_write_as_data():
    """``private`` and ``private_needs``: a need whose test is a value (Empty, Equals) with its test, one whose test
    is a function without (it and the needs after it are the full check's: failed_private_need stops there)."""
    from types import SimpleNamespace

    from clbench import recorded
    from clbench.protocol import NO_REHEARSAL_MEMORY, PrivateNeed, StrategyBase

    slots = PrivateNeed("slots", typecheck.Equals(0), "slots {value}: set slots: 0.")
    mode = PrivateNeed("mode", typecheck.Equals("flat"), "mode {value}: set mode: flat.")
    odd = PrivateNeed("width", lambda width: width % 2 == 0, "width {value} is odd.")
    cls = type("Private", (StrategyBase,), {"private": True,
                                            "private_needs": (NO_REHEARSAL_MEMORY, slots, mode, odd)})
    found = recorded.private_record(cls)
    assert found["private"] is True
    assert [need.get("test") for need in found["private_needs"]] == [{"empty": True}, {"equals": 0},
                                                                      {"equals": "flat"}, None]
    assert recorded.private_record(StrategyBase) == {"private": False, "private_needs": [
        {"field": "mem_size", "refusal": NO_REHEARSAL_MEMORY.refusal, "test": {"empty": True}}]}
    assert recorded.failed_private_need(found, SimpleNamespace(mem_size=0, slots=0, width=3)) is None
    assert recorded.failed_private_need(found, SimpleNamespace(slots=0)) is None        # no mem_size: satisfied
    assert recorded.failed_private_need(found, SimpleNamespace(mem_size=20, slots=2)) == \
        NO_REHEARSAL_MEMORY.refusal.format(value=20)
    assert recorded.failed_private_need(found, SimpleNamespace(mem_size=0, slots=2)) == "slots 2: set slots: 0."
    assert recorded.failed_private_need(found, SimpleNamespace(slots=2)) == "slots 2: set slots: 0."   # after a skip
    assert recorded.failed_private_need(found, SimpleNamespace(mode="flat", width=3)) is None
    assert recorded.failed_private_need(found, SimpleNamespace(mode="auto")) == "mode auto: set mode: flat."
    assert recorded.failed_private_need({"private": False}, SimpleNamespace(mem_size=20)) is None     # no needs
