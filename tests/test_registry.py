import pytest

from clbench.registry import SCENARIOS, STRATEGIES, Registry, UnknownNameError


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
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(float)


def test_plugins_register_the_baselines_and_scenarios():
    for name in ("naive", "cumulative", "joint", "replay", "ewc", "lwf", "icarl", "der_dark", "gdumb"):
        assert name in STRATEGIES
    assert {"split_digits", "synthetic"} <= set(SCENARIOS.names())
    with pytest.raises(UnknownNameError, match="Did you mean 'naive'"):
        STRATEGIES.get("naiv")
