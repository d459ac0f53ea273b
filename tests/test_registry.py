import json
from dataclasses import dataclass

import pytest

from clbench.protocol import (
    StrategyBase,
    StrategyContractError,
    check_strategy,
)
from clbench.registry import CALLBACKS, COMMANDS, SCENARIOS, STRATEGIES, Registry, UnknownNameError
from clbench.typecheck import only_with, setting
from tests._contract import Cfg as _Cfg
from tests._contract import Good as _Good


def test_register_and_get():
    reg = Registry("widget")
    factory = reg.register("alpha")(lambda: 1)
    assert reg.get("alpha") is factory
    assert "alpha" in reg and reg.names() == ["alpha"]


def test_unknown_name_suggests_close_names():
    reg = Registry("widget")
    reg.register("replay")(object)
    with pytest.raises(UnknownNameError, match=r"unknown widget 'replya'\. Did you mean 'replay'\?"):
        reg.get("replya")


def test_unknown_name_without_close_match_lists_known():
    reg = Registry("widget")
    reg.register("replay")(object)
    with pytest.raises(KeyError, match="Known widgets: replay"):
        reg.get("zzz")


def test_registering_a_name_twice_is_an_error():
    reg = Registry("widget")
    reg.register("a")(int)
    with pytest.raises(ValueError, match=r"widget 'a' of tests\.test_registry is already registered by "
                                         r"tests\.test_registry"):
        reg.register("a")(float)


def test_plugins_register_the_baselines_and_scenarios():
    for name in ("naive", "cumulative", "joint", "replay", "ewc", "lwf", "icarl", "der_dark", "gdumb"):
        assert name in STRATEGIES
    assert {"split_digits", "synthetic"} <= set(SCENARIOS.names())
    with pytest.raises(UnknownNameError, match="Did you mean 'naive'"):
        STRATEGIES.get("naiv")


def test_index_is_current():
    """clbench/plugin_index.json is what importing every shipped plugin module gives (`make lists` writes it); a
    stale entry only costs start time (its module is then read or imported), but `clbench list` reads it."""
    from clbench.plugins import INDEX_FILE, build_index

    assert build_index() == json.loads(INDEX_FILE.read_text()), "the registries' index is stale: run `make lists`"


def test_a_changed_config_declaration_makes_the_index_stale(monkeypatch):
    """The index records each strategy's Config declarations (the torch-free phase of suite loading checks values
    against them): changing one (here replay's ``mem_size`` range) changes what :func:`build_index` writes, so
    :func:`test_index_is_current` fails until ``make lists``."""
    from clbench.plugins import INDEX_FILE, build_index
    from clbench.typecheck import METADATA_KEY, Declared, Range

    def replay(index: dict) -> dict:
        return index["modules"]["clbench.strategies.baselines"]["records"]["strategy"]["replay"]

    field = STRATEGIES.get("replay").Config.__dataclass_fields__["mem_size"]
    monkeypatch.setattr(field, "metadata", {METADATA_KEY: Declared(within=Range(10))})
    record = next(f for f in replay(build_index())["fields"] if f["name"] == "mem_size")
    assert record["within"]["low"] == 10
    assert record != next(f for f in replay(json.loads(INDEX_FILE.read_text()))["fields"] if f["name"] == "mem_size")


def test_reading_a_module_finds_every_name_it_registers_or_says_it_cannot():
    """Without the index (a module edited since), names come from the module's code: each name a shipped module
    registers is found there, or its registry is marked as needing the import."""
    from clbench.plugins import load_plugins, scan, shipped_modules
    from clbench.registry import REGISTRIES

    load_plugins()
    files = dict(shipped_modules())
    scanned = {module: scan(path.read_bytes()) for module, path in files.items()}
    for registry in REGISTRIES:
        for name, origin in registry.origins.items():
            if origin in files:
                declared, dynamic = scanned[origin]
                assert name in declared.get(registry.kind, {}) or registry.kind in dynamic, (registry.kind, name)


def test_callbacks_and_commands_are_discovered_not_listed():
    from clbench import registry

    assert {"hook_trace", "dp", "dual_form", "training_log", "tensorboard", "wandb"} <= set(CALLBACKS.names())
    assert {"run", "list", "pretrain", "forget", "analyze"} <= set(COMMANDS.names())
    assert not hasattr(registry, "CALLBACK_MODULES") and not hasattr(registry, "COMMAND_MODULES")


def test_every_sub_command_is_its_own_module_of_clbench_commands():
    """cli.py is the parser and the dispatch only: each shipped sub-command is registered by its own module of
    clbench/commands/, and no other shipped module registers one."""
    from clbench.plugins import scan, shipped_modules

    registering = {}
    for module, path in shipped_modules():
        declared, dynamic = scan(path.read_bytes())
        assert "command" not in dynamic, module
        if declared.get("command"):
            registering[module] = set(declared["command"])
    assert {"run", "list", "leaderboard", "report", "config", "analyze"} <= set().union(*registering.values())
    for module, names in registering.items():
        assert module.startswith("clbench.commands.") and len(names) == 1, (module, names)


@dataclass
class _UsedWithNothing:
    lr: float = setting(0.1, only_with=only_with("optimizer", "sgd"))




@pytest.mark.parametrize("make, message", [
    (lambda: type("NotBase", (), {}), "must be a class deriving from clbench.protocol.StrategyBase"),
    (lambda: type("NoPredict", (StrategyBase,), {"Config": _Cfg, "train": _Good.train,
                                                 "num_parameters": _Good.num_parameters}),
     "does not implement predict"),
    (lambda: type("NoConfig", (_Good,), {"Config": dict}), "Config must be a dataclass"),
    (lambda: type("BadPreset", (_Good,), {"PRESETS": {"cpu": {"lr": 0.1, "epochs": 3}}}),
     r"preset 'cpu' sets unknown Config fields \['epochs'\]"),
    (lambda: type("NoKinds", (_Good,), {"scenario_kinds": ()}), "scenario_kinds must be a non-empty tuple"),
    (lambda: type("KindString", (_Good,), {"scenario_kinds": "next_item"}), "scenario_kinds must be a non-empty"),
    (lambda: type("BadNeeds", (_Good,), {"private_needs": ("mem_size",)}),
     "private_needs must be a tuple of clbench.protocol.PrivateNeed"),
    (lambda: type("UsedWithNothing", (_Good,), {"Config": _UsedWithNothing}),
     "Config field 'lr' is declared used only with 'optimizer', which is not a field of _UsedWithNothing"),
])
def test_registration_refuses_a_class_that_breaks_the_contract(make, message):
    cls = make()
    with pytest.raises(StrategyContractError, match=rf"strategy 'x' \(.*\) {message}|strategy 'x' \(.*\): {message}"):
        check_strategy("x", cls)
    check_strategy("x", _Good)          # the well-formed one passes
