"""A plugin author adds a strategy with a new ranged field, a choice field, a field used only with another and a
scenario requirement by declaring them in the strategy's own module (here: this test), with no edit anywhere else;
a suite that sets them wrong is refused at load with one line naming the entry, and a Config built in Python gets
the same checks. A number the author forgot to declare is not accepted unchecked: it must be ``>= 0``, and the
refusal says how to declare another range."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from clbench.errors import ConfigError
from clbench.protocol import NEXT_ITEM, ParamCount, PrivateNeed, StrategyBase
from clbench.registry import STRATEGIES
from clbench.suite_file import parse_suite
from clbench.typecheck import AT_LEAST_1, Range, RangeChecked, only_with, setting


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
